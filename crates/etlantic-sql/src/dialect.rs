//! The two SQL dialects a region compiles to, and how each stores the value types of
//! portable plans.
//!
//! | value | PostgreSQL | SQLite |
//! |---|---|---|
//! | integer | `BIGINT` | `INTEGER` |
//! | float | `DOUBLE PRECISION` | `REAL` |
//! | decimal(p, s) | `NUMERIC(p, s)` (exact) | `REAL` (binary floating point: the documented tolerance) |
//! | string | `TEXT` | `TEXT` |
//! | boolean | `BOOLEAN` | `INTEGER` 0/1 |
//! | date | `DATE` | `INTEGER` days since 1970-01-01 |
//! | timestamp | `TIMESTAMP` / `TIMESTAMPTZ` (UTC session) | `INTEGER` microseconds since the epoch |
//!
//! SQLite stores dates and timestamps as integers so that comparisons, ordering and
//! arithmetic on them are exact integer operations.

use arrow::datatypes::DataType;

/// An SQL dialect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// PostgreSQL 12 or later.
    Postgres,
    /// SQLite 3.35 or later (window functions, `NULLS FIRST|LAST`).
    Sqlite,
}

impl Dialect {
    /// The backend name of the dialect in profiles and plans.
    pub fn backend_name(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Sqlite => "sqlite",
        }
    }

    /// The most bind parameters one statement may carry.
    pub fn max_binds(self) -> usize {
        match self {
            Dialect::Postgres => 65535,
            Dialect::Sqlite => 32766,
        }
    }
}

/// A quoted identifier.
pub fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// A string literal.
pub fn string_literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// The kind of a value as the compiler reasons about it.
#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    /// Any integer type.
    Int,
    /// Float32/Float64.
    Float,
    /// A decimal with precision and scale.
    Decimal(u8, i8),
    /// A string.
    Text,
    /// A boolean.
    Bool,
    /// A date.
    Date,
    /// A timestamp, with or without a time zone.
    Timestamp {
        /// Whether it carries a zone (an instant).
        zoned: bool,
    },
    /// The type of the null literal.
    Null,
    /// Anything else (lists, binary, ...): passed through, never computed on.
    Other,
}

impl Ty {
    /// The kind of an Arrow type.
    pub fn of(dt: &DataType) -> Ty {
        use DataType::*;
        match dt {
            Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 | UInt64 => Ty::Int,
            Float16 | Float32 | Float64 => Ty::Float,
            Decimal128(p, s) | Decimal256(p, s) => Ty::Decimal(*p, *s),
            Utf8 | LargeUtf8 | Utf8View => Ty::Text,
            Boolean => Ty::Bool,
            Date32 | Date64 => Ty::Date,
            Timestamp(_, tz) => Ty::Timestamp {
                zoned: tz.is_some(),
            },
            Null => Ty::Null,
            _ => Ty::Other,
        }
    }

    /// Whether it is a number.
    pub fn is_numeric(&self) -> bool {
        matches!(self, Ty::Int | Ty::Float | Ty::Decimal(..))
    }

    /// Whether it is a date or timestamp.
    pub fn is_temporal(&self) -> bool {
        matches!(self, Ty::Date | Ty::Timestamp { .. })
    }

    /// The column type a staged value of this kind gets.
    pub fn column_type(&self, dialect: Dialect) -> Option<String> {
        Some(match (dialect, self) {
            (Dialect::Postgres, Ty::Int) => "BIGINT".into(),
            (Dialect::Postgres, Ty::Float) => "DOUBLE PRECISION".into(),
            (Dialect::Postgres, Ty::Decimal(p, s)) => format!("NUMERIC({p},{s})"),
            (Dialect::Postgres, Ty::Text) => "TEXT".into(),
            (Dialect::Postgres, Ty::Bool) => "BOOLEAN".into(),
            (Dialect::Postgres, Ty::Date) => "DATE".into(),
            (Dialect::Postgres, Ty::Timestamp { zoned: false }) => "TIMESTAMP".into(),
            (Dialect::Postgres, Ty::Timestamp { zoned: true }) => "TIMESTAMPTZ".into(),
            (Dialect::Postgres, Ty::Null) => "TEXT".into(),
            (Dialect::Sqlite, Ty::Int | Ty::Bool | Ty::Date | Ty::Timestamp { .. }) => {
                "INTEGER".into()
            }
            (Dialect::Sqlite, Ty::Float | Ty::Decimal(..)) => "REAL".into(),
            (Dialect::Sqlite, Ty::Text | Ty::Null) => "TEXT".into(),
            (_, Ty::Other) => return None,
        })
    }
}

//! The one place where ODCS types map to Arrow types, and back.
//!
//! | ODCS `logicalType` (+ options / `physicalType`) | Arrow |
//! |---|---|
//! | `string` | `Utf8`; `format: binary`/`byte` → `Binary` |
//! | `integer`, `format` i8/i16/i32/i64/u8/u16/u32/u64 | `Int8`…`UInt64`; **no format → `Int64`** |
//! | `integer`, `format` i128/u128 | `Decimal128(38, 0)` |
//! | `number`, `format` f32 / f64 / none | `Float32` / `Float64` / `Float64` |
//! | `number` + `physicalType: decimal(p,s)` or `numeric(p,s)` | `Decimal128(p, s)` (p ≤ 38) |
//! | `boolean` | `Boolean` |
//! | `date` | `Date32` |
//! | `timestamp` | `Timestamp(µs, "UTC")`; `timezone: false` → no zone; `defaultTimezone: Z` → zone Z; `physicalType: timestamp(0/3/6/9)` sets the unit |
//! | `time` | `Time64(µs)` |
//! | `object` | `Struct` of its `properties` |
//! | `array` | `List` of its `items` |
//! | none | from `physicalType` when it names a type, else `Utf8` |
//!
//! Two deviations from the ODCS JSON Schema's defaults, both to match what data engineers
//! get from Spark: an `integer` without `format` is 64-bit (the schema says i32), and a
//! `timestamp` is an instant in UTC unless `timezone: false` says it is a local time.
//! Nullability is `!required`.

use super::{ContractField, FieldConstraints};
use arrow::datatypes::{DataType, Field, Fields, TimeUnit};
use odcs::model::SchemaProperty;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Maps one ODCS property to a contract field.
pub fn contract_field(prop: &SchemaProperty) -> Result<ContractField, String> {
    let name = prop
        .name()
        .ok_or_else(|| "a property has no name".to_string())?
        .to_string();
    let data_type = arrow_type(prop)?;
    let constraints = constraints(prop);
    Ok(ContractField {
        field: Field::new(&name, data_type, !prop.required),
        required: prop.required,
        unique: prop.unique,
        primary_key: prop.primary_key,
        constraints,
    })
}

fn option<'a>(prop: &'a SchemaProperty, key: &str) -> Option<&'a Value> {
    prop.logical_type_options.as_ref().and_then(|o| o.get(key))
}

fn physical(prop: &SchemaProperty) -> Option<(String, Vec<String>)> {
    let raw = prop
        .element
        .physical_type
        .as_deref()?
        .trim()
        .to_ascii_lowercase();
    match raw.split_once('(') {
        Some((name, rest)) => {
            let args = rest
                .trim_end_matches(')')
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            Some((name.trim().to_string(), args))
        }
        None => Some((raw, Vec::new())),
    }
}

/// The Arrow type of an ODCS property.
pub fn arrow_type(prop: &SchemaProperty) -> Result<DataType, String> {
    let name = prop.name().unwrap_or("?");
    let logical = prop.logical_type.as_deref().map(str::to_ascii_lowercase);
    let format = option(prop, "format")
        .and_then(Value::as_str)
        .map(str::to_ascii_lowercase);
    let phys = physical(prop);
    Ok(match logical.as_deref() {
        Some("string") => match format.as_deref() {
            Some("binary") | Some("byte") => DataType::Binary,
            _ => DataType::Utf8,
        },
        Some("integer") => match format.as_deref() {
            Some("i8") => DataType::Int8,
            Some("i16") => DataType::Int16,
            Some("i32") => DataType::Int32,
            Some("i64") | None => DataType::Int64,
            Some("u8") => DataType::UInt8,
            Some("u16") => DataType::UInt16,
            Some("u32") => DataType::UInt32,
            Some("u64") => DataType::UInt64,
            Some("i128") | Some("u128") => DataType::Decimal128(38, 0),
            Some(other) => return Err(format!("field `{name}`: unknown integer format `{other}`")),
        },
        Some("number") => match phys {
            Some((p, args)) if p == "decimal" || p == "numeric" => decimal(name, &args)?,
            _ => match format.as_deref() {
                Some("f32") => DataType::Float32,
                Some("f64") | None => DataType::Float64,
                Some(other) => {
                    return Err(format!("field `{name}`: unknown number format `{other}`"))
                }
            },
        },
        Some("boolean") => DataType::Boolean,
        Some("date") => DataType::Date32,
        Some("time") => DataType::Time64(TimeUnit::Microsecond),
        Some("timestamp") => {
            let unit = match phys {
                Some((p, args)) if p.starts_with("timestamp") && !args.is_empty() => {
                    match args[0].as_str() {
                        "0" => TimeUnit::Second,
                        "1" | "2" | "3" => TimeUnit::Millisecond,
                        "4" | "5" | "6" => TimeUnit::Microsecond,
                        "7" | "8" | "9" => TimeUnit::Nanosecond,
                        other => {
                            return Err(format!(
                                "field `{name}`: bad timestamp precision `{other}`"
                            ))
                        }
                    }
                }
                _ => TimeUnit::Microsecond,
            };
            let tz_included = option(prop, "timezone")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            let tz = if tz_included {
                let zone = option(prop, "defaultTimezone")
                    .and_then(Value::as_str)
                    .map(|z| if z == "Etc/UTC" { "UTC" } else { z })
                    .unwrap_or("UTC");
                Some(Arc::from(zone))
            } else {
                None
            };
            DataType::Timestamp(unit, tz)
        }
        Some("object") => {
            let fields: Result<Vec<Field>, String> = prop
                .properties
                .iter()
                .map(|p| contract_field(p).map(|f| f.field))
                .collect();
            DataType::Struct(Fields::from(fields?))
        }
        Some("array") => {
            let items = prop
                .items
                .as_ref()
                .ok_or_else(|| format!("field `{name}`: array without items"))?;
            let item = contract_field(items)?;
            DataType::List(Arc::new(Field::new(
                "item",
                item.field.data_type().clone(),
                true,
            )))
        }
        Some(other) => return Err(format!("field `{name}`: unsupported logicalType `{other}`")),
        None => match phys {
            Some((p, args)) => physical_only(name, &p, &args)?,
            None => DataType::Utf8,
        },
    })
}

fn decimal(name: &str, args: &[String]) -> Result<DataType, String> {
    let p: u8 = args
        .first()
        .and_then(|a| a.parse().ok())
        .ok_or_else(|| format!("field `{name}`: decimal needs a precision"))?;
    let s: i8 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(0);
    if p == 0 || p > 38 || s < 0 || s as u8 > p {
        return Err(format!(
            "field `{name}`: decimal({p},{s}) is out of range (precision 1..=38, 0 <= scale <= precision)"
        ));
    }
    Ok(DataType::Decimal128(p, s))
}

fn physical_only(name: &str, p: &str, args: &[String]) -> Result<DataType, String> {
    Ok(match p {
        "varchar" | "char" | "text" | "string" => DataType::Utf8,
        "int" | "integer" | "int4" => DataType::Int32,
        "bigint" | "int8" | "long" => DataType::Int64,
        "smallint" | "int2" => DataType::Int16,
        "tinyint" => DataType::Int8,
        "float" | "real" | "float4" => DataType::Float32,
        "double" | "float8" | "double precision" => DataType::Float64,
        "decimal" | "numeric" => decimal(name, args)?,
        "boolean" | "bool" => DataType::Boolean,
        "date" => DataType::Date32,
        "timestamp" | "timestamptz" => {
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        }
        other => {
            return Err(format!(
                "field `{name}`: no logicalType and unknown physicalType `{other}`"
            ))
        }
    })
}

fn constraints(prop: &SchemaProperty) -> FieldConstraints {
    let num = |k: &str| {
        option(prop, k).and_then(|v| {
            v.as_f64()
                .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        })
    };
    let int = |k: &str| option(prop, k).and_then(Value::as_u64);
    FieldConstraints {
        minimum: num("minimum"),
        maximum: num("maximum"),
        exclusive_minimum: num("exclusiveMinimum"),
        exclusive_maximum: num("exclusiveMaximum"),
        min_length: int("minLength"),
        max_length: int("maxLength"),
        pattern: option(prop, "pattern")
            .and_then(Value::as_str)
            .map(String::from),
    }
}

/// The ODCS property (as JSON) that describes an Arrow field; the inverse of
/// [`arrow_type`] for every type it produces.
pub fn property_from_field(field: &Field) -> Value {
    let mut p = Map::new();
    p.insert("name".into(), json!(field.name()));
    let (logical, options, physical): (&str, Option<Value>, Option<String>) = match field
        .data_type()
    {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => ("string", None, None),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            ("string", Some(json!({"format": "binary"})), None)
        }
        DataType::Int8 => ("integer", Some(json!({"format": "i8"})), None),
        DataType::Int16 => ("integer", Some(json!({"format": "i16"})), None),
        DataType::Int32 => ("integer", Some(json!({"format": "i32"})), None),
        DataType::Int64 => ("integer", Some(json!({"format": "i64"})), None),
        DataType::UInt8 => ("integer", Some(json!({"format": "u8"})), None),
        DataType::UInt16 => ("integer", Some(json!({"format": "u16"})), None),
        DataType::UInt32 => ("integer", Some(json!({"format": "u32"})), None),
        DataType::UInt64 => ("integer", Some(json!({"format": "u64"})), None),
        DataType::Float16 | DataType::Float32 => ("number", Some(json!({"format": "f32"})), None),
        DataType::Float64 => ("number", Some(json!({"format": "f64"})), None),
        DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => {
            ("number", None, Some(format!("decimal({p},{s})")))
        }
        DataType::Boolean => ("boolean", None, None),
        DataType::Date32 | DataType::Date64 => ("date", None, None),
        DataType::Time32(_) | DataType::Time64(_) => ("time", None, None),
        DataType::Timestamp(unit, tz) => {
            let digits = match unit {
                TimeUnit::Second => 0,
                TimeUnit::Millisecond => 3,
                TimeUnit::Microsecond => 6,
                TimeUnit::Nanosecond => 9,
            };
            let options = match tz.as_deref() {
                None => Some(json!({"timezone": false})),
                Some("UTC") => None,
                Some(zone) => Some(json!({"timezone": true, "defaultTimezone": zone})),
            };
            let physical = (digits != 6).then(|| format!("timestamp({digits})"));
            ("timestamp", options, physical)
        }
        DataType::Struct(fields) => {
            p.insert(
                "properties".into(),
                Value::Array(fields.iter().map(|f| property_from_field(f)).collect()),
            );
            ("object", None, None)
        }
        DataType::List(item) | DataType::LargeList(item) => {
            let mut items = property_from_field(item);
            items["name"] = json!("item");
            p.insert("items".into(), items);
            ("array", None, None)
        }
        _ => ("string", None, Some(field.data_type().to_string())),
    };
    p.insert("logicalType".into(), json!(logical));
    if let Some(o) = options {
        p.insert("logicalTypeOptions".into(), o);
    }
    if let Some(ph) = physical {
        p.insert("physicalType".into(), json!(ph));
    }
    if !field.is_nullable() {
        p.insert("required".into(), json!(true));
    }
    Value::Object(p)
}

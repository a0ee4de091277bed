//! Tables across the Spark Connect boundary: Arrow tables into Spark local relations,
//! Spark's Arrow results into the schema the plan promised.

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType, Int16Type, Int32Type, Int64Type, Int8Type, SchemaRef, TimeUnit};
use arrow::datatypes::{
    Date32Type, Float32Type, Float64Type, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt16Type, UInt32Type, UInt8Type,
};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use spark_connect::row::{Row, Value};
use spark_connect::types::{DataType as SparkType, StructField};
use std::collections::BTreeMap;

fn unsupported_type(column: &str, dt: &DataType) -> Error {
    Error::new(
        &codes::UNSUPPORTED_TYPE,
        format!("column `{column}` is {dt}, which the Spark backend does not hand to Spark"),
    )
    .with_help("Cast it to an integer, float, decimal, string, boolean, date or timestamp first.")
}

/// The Spark type a column is sent as.
fn spark_type(column: &str, dt: &DataType) -> Result<SparkType> {
    Ok(match dt {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32 => SparkType::Long,
        DataType::Float32 | DataType::Float64 => SparkType::Double,
        DataType::Decimal128(p, s) if *s >= 0 && *p <= 38 => SparkType::Decimal {
            precision: *p as i32,
            scale: *s as i32,
        },
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => SparkType::String {
            collation: "UTF8_BINARY".into(),
        },
        DataType::Boolean => SparkType::Boolean,
        DataType::Date32 => SparkType::Date,
        DataType::Timestamp(_, Some(_)) => SparkType::Timestamp,
        DataType::Timestamp(_, None) => SparkType::TimestampNtz,
        DataType::Null => SparkType::Null,
        other => return Err(unsupported_type(column, other)),
    })
}

fn micros(unit: &TimeUnit, v: i64) -> Option<i64> {
    match unit {
        TimeUnit::Second => v.checked_mul(1_000_000),
        TimeUnit::Millisecond => v.checked_mul(1_000),
        TimeUnit::Microsecond => Some(v),
        // Spark keeps microseconds; nanoseconds below them are dropped.
        TimeUnit::Nanosecond => Some(v.div_euclid(1_000)),
    }
}

fn value(column: &str, a: &dyn Array, i: usize) -> Result<Value> {
    if a.is_null(i) {
        return Ok(Value::Null);
    }
    Ok(match a.data_type() {
        DataType::Int8 => Value::Long(a.as_primitive::<Int8Type>().value(i) as i64),
        DataType::Int16 => Value::Long(a.as_primitive::<Int16Type>().value(i) as i64),
        DataType::Int32 => Value::Long(a.as_primitive::<Int32Type>().value(i) as i64),
        DataType::Int64 => Value::Long(a.as_primitive::<Int64Type>().value(i)),
        DataType::UInt8 => Value::Long(a.as_primitive::<UInt8Type>().value(i) as i64),
        DataType::UInt16 => Value::Long(a.as_primitive::<UInt16Type>().value(i) as i64),
        DataType::UInt32 => Value::Long(a.as_primitive::<UInt32Type>().value(i) as i64),
        DataType::Float32 => Value::Double(a.as_primitive::<Float32Type>().value(i) as f64),
        DataType::Float64 => Value::Double(a.as_primitive::<Float64Type>().value(i)),
        DataType::Decimal128(p, s) => Value::Decimal {
            value: a
                .as_primitive::<arrow::datatypes::Decimal128Type>()
                .value_as_string(i),
            precision: Some(*p as i32),
            scale: Some(*s as i32),
        },
        DataType::Utf8 => Value::String(a.as_string::<i32>().value(i).to_string()),
        DataType::LargeUtf8 => Value::String(a.as_string::<i64>().value(i).to_string()),
        DataType::Utf8View => Value::String(a.as_string_view().value(i).to_string()),
        DataType::Boolean => Value::Bool(a.as_boolean().value(i)),
        DataType::Date32 => Value::Date(a.as_primitive::<Date32Type>().value(i)),
        DataType::Timestamp(unit, _) => {
            let v = match unit {
                TimeUnit::Second => a.as_primitive::<TimestampSecondType>().value(i),
                TimeUnit::Millisecond => a.as_primitive::<TimestampMillisecondType>().value(i),
                TimeUnit::Microsecond => a.as_primitive::<TimestampMicrosecondType>().value(i),
                TimeUnit::Nanosecond => a.as_primitive::<TimestampNanosecondType>().value(i),
            };
            Value::Timestamp(micros(unit, v).ok_or_else(|| {
                Error::new(
                    &codes::RECORD_TYPE_MISMATCH,
                    format!("column `{column}`: timestamp {v} {unit:?} is out of Spark's range"),
                )
            })?)
        }
        other => return Err(unsupported_type(column, other)),
    })
}

/// The rows and Spark schema of a table, with a last column `ordinal` holding each row's
/// position (see [`crate::compile::ORD`]).
pub fn to_rows(table: &Table, ordinal: &str) -> Result<(Vec<Row>, SparkType)> {
    let mut fields = Vec::new();
    let mut names = Vec::new();
    for f in table.schema.fields() {
        fields.push(StructField {
            name: f.name().clone(),
            data_type: spark_type(f.name(), f.data_type())?,
            nullable: true,
            metadata: BTreeMap::new(),
        });
        names.push(f.name().clone());
    }
    fields.push(StructField {
        name: ordinal.to_string(),
        data_type: SparkType::Long,
        nullable: false,
        metadata: BTreeMap::new(),
    });
    names.push(ordinal.to_string());
    let mut rows = Vec::with_capacity(table.num_rows());
    let mut position = 0i64;
    for batch in &table.batches {
        for i in 0..batch.num_rows() {
            let mut values = Vec::with_capacity(names.len());
            for (c, f) in batch.columns().iter().zip(table.schema.fields()) {
                values.push(value(f.name(), c.as_ref(), i)?);
            }
            values.push(Value::Long(position));
            position += 1;
            rows.push(Row::new(names.clone(), values));
        }
    }
    Ok((rows, SparkType::Struct { fields }))
}

/// Spark's result batches as a table of `schema`: columns by name, each cast to the
/// promised type. A value that does not convert is an error (`ETL707`), never a null.
pub fn conform(batches: Vec<RecordBatch>, schema: &SchemaRef) -> Result<Table> {
    let options = CastOptions {
        safe: false,
        ..Default::default()
    };
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        if b.num_rows() == 0 {
            continue;
        }
        let mut columns = Vec::with_capacity(schema.fields().len());
        for f in schema.fields() {
            let c = b.column_by_name(f.name()).ok_or_else(|| {
                Error::new(
                    &codes::ENGINE_ERROR,
                    format!("Spark's result has no column `{}`", f.name()),
                )
            })?;
            let c = if c.data_type() == f.data_type() {
                c.clone()
            } else {
                cast_with_options(c, f.data_type(), &options).map_err(|e| {
                    Error::new(
                        &codes::ENGINE_ERROR,
                        format!(
                            "Spark's `{}` ({}) does not convert to {}: {e}",
                            f.name(),
                            c.data_type(),
                            f.data_type()
                        ),
                    )
                })?
            };
            columns.push(c);
        }
        out.push(
            RecordBatch::try_new(schema.clone(), columns)
                .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("Spark's result: {e}")))?,
        );
    }
    Ok(Table::new(schema.clone(), out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, StringArray, TimestampMillisecondArray};
    use arrow::datatypes::{Field, Schema};
    use std::sync::Arc;

    #[test]
    fn rows_carry_their_position_and_spark_types() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, true),
            Field::new("name", DataType::Utf8, true),
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Millisecond, Some("UTC".into())),
                true,
            ),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int32Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec![Some("a"), Some("b")])),
                Arc::new(
                    TimestampMillisecondArray::from(vec![Some(1_500), None]).with_timezone("UTC"),
                ),
            ],
        )
        .unwrap();
        let (rows, ty) = to_rows(&Table::new(schema, vec![batch]), "__ord").unwrap();
        assert_eq!(rows.len(), 2);
        let SparkType::Struct { fields } = ty else {
            panic!("a struct")
        };
        let types: Vec<_> = fields.iter().map(|f| f.data_type.clone()).collect();
        assert_eq!(types[0], SparkType::Long);
        assert_eq!(types[2], SparkType::Timestamp);
        assert_eq!(types[3], SparkType::Long);
        assert_eq!(rows[1].values()[0], Value::Null);
        assert_eq!(rows[0].values()[2], Value::Timestamp(1_500_000));
        assert_eq!(rows[1].values()[3], Value::Long(1));
    }

    #[test]
    fn results_are_cast_to_the_promised_schema_and_never_silently_nulled() {
        let spark = Arc::new(Schema::new(vec![Field::new("n", DataType::Int64, true)]));
        let batch = RecordBatch::try_new(
            spark,
            vec![Arc::new(arrow::array::Int64Array::from(vec![1, 300]))],
        )
        .unwrap();
        let wide = Arc::new(Schema::new(vec![Field::new("n", DataType::Float64, true)]));
        let t = conform(vec![batch.clone()], &wide).unwrap();
        assert_eq!(t.num_rows(), 2);
        let narrow = Arc::new(Schema::new(vec![Field::new("n", DataType::Int8, true)]));
        let e = conform(vec![batch], &narrow).unwrap_err();
        assert_eq!(e.code(), "ETL707");
    }
}

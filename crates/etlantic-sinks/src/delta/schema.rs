//! The schema of a table the sink creates: Arrow types mapped to Delta's (timestamps in
//! microseconds, zoned ones in UTC), top-level columns nullable; and batches cast to it.

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef, Fields, Schema, SchemaRef, TimeUnit};
use etlantic_core::diagnostics::{codes, Error, Result};
use std::sync::Arc;

/// The Delta type of an Arrow type: zoned timestamps as `Timestamp(µs, "UTC")`, naive
/// ones as `Timestamp(µs)`, at any depth.
fn delta_type(dt: &DataType) -> DataType {
    match dt {
        DataType::Timestamp(_, Some(_)) => {
            DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        }
        DataType::Timestamp(_, None) => DataType::Timestamp(TimeUnit::Microsecond, None),
        DataType::Date64 => DataType::Date32,
        DataType::Struct(fields) => DataType::Struct(delta_fields(fields)),
        DataType::List(item) => DataType::List(delta_field(item)),
        DataType::LargeList(item) => DataType::LargeList(delta_field(item)),
        other => other.clone(),
    }
}

fn delta_field(f: &FieldRef) -> FieldRef {
    Arc::new(f.as_ref().clone().with_data_type(delta_type(f.data_type())))
}

fn delta_top_field(f: &FieldRef) -> FieldRef {
    Arc::new(
        f.as_ref()
            .clone()
            .with_data_type(delta_type(f.data_type()))
            .with_nullable(true),
    )
}

fn delta_fields(fields: &Fields) -> Fields {
    fields.iter().map(delta_field).collect()
}

/// The Arrow schema a Delta table created from `schema` has: Delta types (see
/// the [module docs](super)), every top-level column nullable (the contract checks
/// required columns before the sink; a nullable table keeps its schema stable across
/// batches whose Arrow nullability differs).
pub fn delta_schema(schema: &Schema) -> SchemaRef {
    Arc::new(Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(delta_top_field)
            .collect::<Fields>(),
        schema.metadata().clone(),
    ))
}

/// Casts the batches to [`delta_schema`].
pub(super) fn delta_batches(
    schema: &SchemaRef,
    batches: &[RecordBatch],
) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    let target = delta_schema(schema);
    let err = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}"));
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let columns = b
            .columns()
            .iter()
            .zip(target.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c.clone())
                } else {
                    cast(c, f.data_type())
                }
            })
            .collect::<std::result::Result<Vec<ArrayRef>, _>>()
            .map_err(err)?;
        out.push(RecordBatch::try_new(target.clone(), columns).map_err(err)?);
    }
    Ok((target, out))
}

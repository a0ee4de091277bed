//! Arrow tables in and out of DataFusion.
//!
//! Inputs become in-memory scans with a hidden ordinal column ([`ORD`]) that numbers the
//! rows in the order they were handed in; outputs are collected and conformed to the exact
//! schema that [`crate::DataFusionBackend`] reports from `output_schema`.

use crate::error::{self, DfResultExt};
use arrow::array::{Array, ArrayRef, Int64Array, RecordBatch, RecordBatchOptions};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::catalog::TableProvider;
use datafusion::common::TableReference;
use datafusion::datasource::{provider_as_source, MemTable};
use datafusion::execution::SessionState;
use datafusion::logical_expr::LogicalPlanBuilder;
use datafusion::prelude::DataFrame;
use etlantic_core::data::Table;
use etlantic_core::Result;
use std::sync::Arc;

/// The hidden column that carries the order of a relation's rows.
pub(crate) const ORD: &str = "__etl_ord";

/// Column names starting with this prefix are reserved for the engine.
pub(crate) const RESERVED_PREFIX: &str = "__etl_";

/// Whether a column name is reserved for the engine.
pub(crate) fn is_reserved(name: &str) -> bool {
    name.starts_with(RESERVED_PREFIX)
}

/// Rejects user column names in the engine's reserved namespace.
pub(crate) fn check_names(schema: &Schema, what: &str) -> Result<()> {
    match schema.fields().iter().find(|f| is_reserved(f.name())) {
        Some(f) => Err(error::invalid_plan(format!(
            "{what} has a column `{}`; names starting with `{RESERVED_PREFIX}` are reserved by the DataFusion backend",
            f.name()
        ))),
        None => Ok(()),
    }
}

/// A scan of `table` named `name`, with the ordinal column [`ORD`] appended (0, 1, ...).
pub(crate) fn scan(state: &SessionState, name: &str, table: &Table) -> Result<DataFrame> {
    let (schema, batches) = with_ordinals(name, table)?;
    let mem = MemTable::try_new(schema, vec![batches]).df(&format!("input `{name}`"))?;
    scan_provider(state, name, Arc::new(mem))
}

/// A scan named `name` of `provider`, whose schema is [`ordinal_schema`] of the input's.
pub(crate) fn scan_provider(
    state: &SessionState,
    name: &str,
    provider: Arc<dyn TableProvider>,
) -> Result<DataFrame> {
    let plan = LogicalPlanBuilder::scan(
        TableReference::bare(name),
        provider_as_source(provider),
        None,
    )
    .and_then(|b| b.build())
    .df(&format!("input `{name}`"))?;
    Ok(DataFrame::new(state.clone(), plan))
}

/// `schema` with the ordinal column [`ORD`] appended.
pub(crate) fn ordinal_schema(schema: &Schema) -> SchemaRef {
    let mut fields: Vec<Field> = schema.fields().iter().map(|f| f.as_ref().clone()).collect();
    fields.push(Field::new(ORD, DataType::Int64, false));
    Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()))
}

/// The batches of `table` (named `name` in errors) with the ordinal column [`ORD`]
/// appended (0, 1, ... across batches), and their schema.
pub(crate) fn with_ordinals(name: &str, table: &Table) -> Result<(SchemaRef, Vec<RecordBatch>)> {
    check_names(&table.schema, &format!("input `{name}`"))?;
    let schema = ordinal_schema(&table.schema);
    let mut offset: i64 = 0;
    let mut batches = Vec::with_capacity(table.batches.len());
    for b in &table.batches {
        if b.num_columns() != table.schema.fields().len() {
            return Err(error::engine(format!(
                "input `{name}`: a batch has {} columns but the schema has {}",
                b.num_columns(),
                table.schema.fields().len()
            )));
        }
        let n = b.num_rows() as i64;
        let mut columns: Vec<ArrayRef> = b.columns().to_vec();
        columns.push(Arc::new(Int64Array::from_iter_values(offset..offset + n)));
        offset += n;
        let batch = RecordBatch::try_new_with_options(
            schema.clone(),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(n as usize)),
        )
        .map_err(|e| error::arrow(e, &format!("input `{name}`")))?;
        batches.push(batch);
    }
    Ok((schema, batches))
}

/// The Arrow schema of a data frame (qualifiers dropped).
pub(crate) fn arrow_schema(df: &DataFrame) -> SchemaRef {
    Arc::new(df.schema().as_arrow().clone())
}

/// Rebuilds `batches` with exactly `schema` (same column order; types cast when the
/// physical plan chose another encoding of the same logical type).
pub(crate) fn conform(schema: &SchemaRef, batches: Vec<RecordBatch>) -> Result<Vec<RecordBatch>> {
    batches
        .into_iter()
        .filter(|b| b.num_rows() > 0)
        .map(|b| {
            if b.num_columns() != schema.fields().len() {
                return Err(error::engine(format!(
                    "the engine produced {} columns where {} were planned",
                    b.num_columns(),
                    schema.fields().len()
                )));
            }
            let columns = b
                .columns()
                .iter()
                .zip(schema.fields())
                .map(|(c, f)| {
                    if c.data_type() == f.data_type() {
                        Ok(c.clone())
                    } else {
                        arrow::compute::cast(c, f.data_type())
                            .map_err(|e| error::arrow(e, &format!("column `{}`", f.name())))
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            RecordBatch::try_new_with_options(
                schema.clone(),
                columns,
                &RecordBatchOptions::new().with_row_count(Some(b.num_rows())),
            )
            .map_err(|e| error::arrow(e, "output"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringArray;

    #[test]
    fn conform_casts_encodings_and_drops_empty_batches() {
        let schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8, true)]));
        let view_schema = Arc::new(Schema::new(vec![Field::new("s", DataType::Utf8View, true)]));
        let view =
            arrow::compute::cast(&StringArray::from(vec!["a"]), &DataType::Utf8View).unwrap();
        let b = RecordBatch::try_new(view_schema.clone(), vec![view]).unwrap();
        let empty = RecordBatch::new_empty(view_schema);
        let out = conform(&schema, vec![b, empty]).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].schema(), schema);
    }

    #[test]
    fn reserved_names_are_rejected() {
        let schema = Schema::new(vec![Field::new("__etl_ord", DataType::Int64, true)]);
        assert_eq!(check_names(&schema, "x").unwrap_err().code(), "ETL006");
    }
}

//! The handover between arrow-rs and Polars through the Arrow C data interface.
//!
//! ETLantic moves data as arrow-rs [`RecordBatch`]es; Polars has its own Arrow
//! implementation (`polars-arrow`). Both implement the [C data
//! interface](https://arrow.apache.org/docs/format/CDataInterface.html), whose two C
//! structs (`ArrowArray`, `ArrowSchema`) have the same layout in both crates. A column
//! crosses the boundary without copying its buffers:
//!
//! 1. arrow-rs exports it ([`arrow::ffi::to_ffi`]: an `FFI_ArrowArray` and an
//!    `FFI_ArrowSchema` that own a reference to the buffers and a `release` callback);
//! 2. the structs are moved, bit for bit, into `polars_arrow::ffi::ArrowArray` /
//!    `ArrowSchema` (same C ABI; the move transfers the ownership of the `release`
//!    callback, which runs once, when Polars drops the last reference);
//! 3. Polars imports them ([`polars_arrow::ffi::import_field_from_c`],
//!    [`polars_arrow::ffi::import_array_from_c`]) and builds a [`Series`].
//!
//! Results go the other way ([`polars_arrow::ffi::export_array_to_c`] →
//! [`arrow::ffi::from_ffi`]) and are then cast to the schema ETLantic promised
//! ([`dataframe_to_table`]).
//!
//! # Types
//!
//! Polars stores fewer physical types than Arrow, so some columns are widened on the
//! arrow-rs side before the export ([`polars_input_type`]): 8/16-bit integers to 32 bits,
//! `Float16` to `Float32`, 32/64-bit decimals to `Decimal128`, `Date64` to a millisecond
//! timestamp, seconds to milliseconds (Polars has no second unit), dictionaries to their
//! values, fixed-size binary to binary. Widening never
//! changes a value, and every result is cast back to the promised type. Strings arrive
//! in Polars as `Utf8View` whatever their Arrow encoding, and leave it as `Utf8View`
//! (cast afterwards). Types Polars cannot hold here (times, intervals, lists, structs,
//! maps, 256-bit decimals) are refused with `ETL501`.

use crate::error::{self, PlResultExt};
use arrow::array::{make_array, Array, ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::compute::{cast_with_options, CastOptions};
use arrow::datatypes::{DataType as ArrowType, Field as ArrowField, Schema, SchemaRef};
use arrow::ffi::{FFI_ArrowArray, FFI_ArrowSchema};
use etlantic_core::data::Table;
use etlantic_core::Result;
use polars::prelude::{
    CompatLevel, DataFrame, DataType as PlType, PlSmallStr, Series, TimeUnit as PlTimeUnit,
    TimeZone,
};
use std::sync::Arc;

// The two crates' C structs must have the same size for the moves below (checked at
// compile time by `transmute`, asserted here for the reader).
const _: () = assert!(
    std::mem::size_of::<FFI_ArrowArray>() == std::mem::size_of::<polars_arrow::ffi::ArrowArray>()
);
const _: () = assert!(
    std::mem::size_of::<FFI_ArrowSchema>() == std::mem::size_of::<polars_arrow::ffi::ArrowSchema>()
);

/// The Arrow type a column of `dt` is widened to before it is handed to Polars, or
/// `None` when the backend cannot hold the type (`ETL501`).
pub fn polars_input_type(dt: &ArrowType) -> Option<ArrowType> {
    use arrow::datatypes::TimeUnit as TU;
    use ArrowType as A;
    Some(match dt {
        A::Null
        | A::Boolean
        | A::Int32
        | A::Int64
        | A::UInt32
        | A::UInt64
        | A::Float32
        | A::Float64
        | A::Utf8
        | A::LargeUtf8
        | A::Utf8View
        | A::Binary
        | A::LargeBinary
        | A::BinaryView
        | A::Date32 => dt.clone(),
        // Polars has no second unit.
        A::Timestamp(TU::Second, tz) => A::Timestamp(TU::Millisecond, tz.clone()),
        A::Duration(TU::Second) => A::Duration(TU::Millisecond),
        A::Timestamp(_, _) | A::Duration(_) => dt.clone(),
        A::Decimal128(_, s) if *s >= 0 => dt.clone(),
        A::Int8 | A::Int16 => A::Int32,
        A::UInt8 | A::UInt16 => A::UInt32,
        A::Float16 => A::Float32,
        A::Decimal32(p, s) | A::Decimal64(p, s) if *s >= 0 => A::Decimal128(*p, *s),
        A::Date64 => A::Timestamp(TU::Millisecond, None),
        A::FixedSizeBinary(_) => A::Binary,
        A::Dictionary(_, values) => return polars_input_type(values),
        _ => return None,
    })
}

/// The Polars type a column of Arrow type `dt` has inside the backend (after
/// [`polars_input_type`]).
pub fn polars_type(dt: &ArrowType) -> Option<PlType> {
    use ArrowType as A;
    let widened = polars_input_type(dt)?;
    Some(match &widened {
        A::Null => PlType::Null,
        A::Boolean => PlType::Boolean,
        A::Int32 => PlType::Int32,
        A::Int64 => PlType::Int64,
        A::UInt32 => PlType::UInt32,
        A::UInt64 => PlType::UInt64,
        A::Float32 => PlType::Float32,
        A::Float64 => PlType::Float64,
        A::Utf8 | A::LargeUtf8 | A::Utf8View => PlType::String,
        A::Binary | A::LargeBinary | A::BinaryView => PlType::Binary,
        A::Date32 => PlType::Date,
        A::Timestamp(u, tz) => PlType::Datetime(
            time_unit(*u),
            tz.as_deref()
                .filter(|z| !z.is_empty())
                // SAFETY: Polars validates zones only with its `timezones` feature, which
                // this crate does not enable; the zone is carried through unchanged.
                .map(|z| unsafe { TimeZone::new_unchecked(z) }),
        ),
        A::Duration(u) => PlType::Duration(time_unit(*u)),
        A::Decimal128(p, s) => PlType::Decimal(*p as usize, *s as usize),
        _ => return None,
    })
}

fn time_unit(u: arrow::datatypes::TimeUnit) -> PlTimeUnit {
    match u {
        arrow::datatypes::TimeUnit::Second | arrow::datatypes::TimeUnit::Millisecond => {
            PlTimeUnit::Milliseconds
        }
        arrow::datatypes::TimeUnit::Microsecond => PlTimeUnit::Microseconds,
        arrow::datatypes::TimeUnit::Nanosecond => PlTimeUnit::Nanoseconds,
    }
}

/// Checks that every column of `schema` can be handed to Polars (`ETL501` otherwise).
pub fn check_schema(schema: &Schema, what: &str) -> Result<()> {
    for f in schema.fields() {
        if polars_type(f.data_type()).is_none() {
            return Err(error::unsupported(format!(
                "column `{}` of {what}: values of type {}",
                f.name(),
                f.data_type()
            )));
        }
    }
    Ok(())
}

/// The arrow-rs array handed to Polars for `array` (widened, see [`polars_input_type`]).
fn widen(array: &ArrayRef, name: &str) -> Result<ArrayRef> {
    let dt = array.data_type();
    let target = match polars_input_type(dt) {
        Some(t) => t,
        None => {
            return Err(error::unsupported(format!(
                "column `{name}`: values of type {dt}"
            )))
        }
    };
    if &target == dt {
        Ok(array.clone())
    } else {
        strict_cast(array, &target).map_err(|e| error::arrow(e, &format!("column `{name}`")))
    }
}

fn strict_cast(array: &ArrayRef, to: &ArrowType) -> arrow::error::Result<ArrayRef> {
    cast_with_options(
        array,
        to,
        &CastOptions {
            safe: false,
            ..Default::default()
        },
    )
}

/// Moves one arrow-rs array into a Polars [`Series`] named `name` through the C data
/// interface (the buffers are shared, not copied).
pub fn array_to_series(name: &str, array: &ArrayRef) -> Result<Series> {
    let array = widen(array, name)?;
    let context = format!("column `{name}` (to Polars)");
    let (ffi_array, ffi_schema) =
        arrow::ffi::to_ffi(&array.to_data()).map_err(|e| error::arrow(e, &context))?;
    // SAFETY: both structs are the `repr(C)` structs of the Arrow C data interface, with
    // identical layouts (sizes asserted above). Moving them hands the `release` callback
    // over to Polars, which calls it exactly once.
    let (pl_array, pl_schema) = unsafe {
        (
            std::mem::transmute::<FFI_ArrowArray, polars_arrow::ffi::ArrowArray>(ffi_array),
            std::mem::transmute::<FFI_ArrowSchema, polars_arrow::ffi::ArrowSchema>(ffi_schema),
        )
    };
    // SAFETY: the structs were produced by arrow-rs' exporter just above and are valid.
    let field = unsafe { polars_arrow::ffi::import_field_from_c(&pl_schema) }.pl(&context)?;
    let imported = unsafe { polars_arrow::ffi::import_array_from_c(pl_array, field.dtype.clone()) }
        .pl(&context)?;
    Series::from_arrow(PlSmallStr::from_str(name), imported).pl(&context)
}

/// Moves a Polars [`Series`] out as an arrow-rs array through the C data interface (in
/// Polars' own encoding: strings as `Utf8View`, decimals as `Decimal128`, ...).
pub fn series_to_array(series: &Series) -> Result<ArrayRef> {
    if series.dtype() == &PlType::Null {
        // Polars' null arrays carry a validity buffer the C data interface does not
        // have; nothing needs to cross.
        return Ok(arrow::array::new_null_array(&ArrowType::Null, series.len()));
    }
    let context = format!("column `{}` (from Polars)", series.name());
    let series = series.rechunk();
    let field = series
        .dtype()
        .to_arrow_field(series.name().clone(), CompatLevel::newest());
    let chunk = if series.chunks().is_empty() {
        polars_arrow::array::new_empty_array(field.dtype.clone())
    } else {
        series.to_arrow(0, CompatLevel::newest())
    };
    let pl_schema = polars_arrow::ffi::export_field_to_c(&field);
    let pl_array = polars_arrow::ffi::export_array_to_c(chunk);
    // SAFETY: as in `array_to_series`, in the other direction.
    let (ffi_array, ffi_schema) = unsafe {
        (
            std::mem::transmute::<polars_arrow::ffi::ArrowArray, FFI_ArrowArray>(pl_array),
            std::mem::transmute::<polars_arrow::ffi::ArrowSchema, FFI_ArrowSchema>(pl_schema),
        )
    };
    // SAFETY: the structs were produced by Polars' exporter just above and are valid.
    let data = unsafe { arrow::ffi::from_ffi(ffi_array, &ffi_schema) }
        .map_err(|e| error::arrow(e, &context))?;
    Ok(make_array(data))
}

/// The rows of `table` as a Polars [`DataFrame`] (batches concatenated, columns widened
/// as described in the module documentation).
pub fn table_to_dataframe(table: &Table) -> Result<DataFrame> {
    check_schema(&table.schema, "the input")?;
    let batch = table
        .concat()
        .map_err(|e| error::arrow(e, "concatenating the input batches"))?;
    let columns = batch
        .columns()
        .iter()
        .zip(table.schema.fields())
        .map(|(c, f)| array_to_series(f.name(), c).map(Into::into))
        .collect::<Result<Vec<_>>>()?;
    DataFrame::new(batch.num_rows(), columns).pl("building the Polars frame")
}

/// An empty Polars frame with the columns of `schema` (for planning without data).
pub fn empty_dataframe(schema: &Schema) -> Result<DataFrame> {
    check_schema(schema, "the input")?;
    let columns = schema
        .fields()
        .iter()
        .map(|f| {
            let dt = polars_type(f.data_type()).expect("checked");
            Series::new_empty(PlSmallStr::from_str(f.name()), &dt).into()
        })
        .collect::<Vec<_>>();
    DataFrame::new(0, columns).pl("building an empty Polars frame")
}

/// The columns of `df` as an arrow-rs table in exactly `schema` (same names, in this
/// order; values cast to the schema's types, failing instead of losing a value). A
/// column the schema declares non-nullable that holds nulls makes the field nullable, as
/// [`Table::conform_to`] does. An empty frame gives a table without batches.
pub fn dataframe_to_table(df: &DataFrame, schema: &SchemaRef) -> Result<Table> {
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for f in schema.fields() {
        let column = df.column(f.name()).map_err(|_| {
            error::engine(format!(
                "the Polars result has no column `{}` (columns: {})",
                f.name(),
                df.get_column_names()
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
        let array = series_to_array(column.as_materialized_series())?;
        let array = if array.data_type() == f.data_type() {
            array
        } else {
            strict_cast(&array, f.data_type())
                .map_err(|e| error::arrow(e, &format!("column `{}`", f.name())))?
        };
        columns.push(array);
    }
    let rows = df.height();
    if rows == 0 {
        return Ok(Table::new(schema.clone(), vec![]));
    }
    let relaxed = schema
        .fields()
        .iter()
        .zip(&columns)
        .any(|(f, c)| !f.is_nullable() && c.null_count() > 0);
    let schema = if relaxed {
        Arc::new(Schema::new_with_metadata(
            schema
                .fields()
                .iter()
                .zip(&columns)
                .map(|(f, c)| {
                    let nullable = f.is_nullable() || c.null_count() > 0;
                    ArrowField::clone(f).with_nullable(nullable)
                })
                .collect::<Vec<_>>(),
            schema.metadata().clone(),
        ))
    } else {
        schema.clone()
    };
    let batch = RecordBatch::try_new_with_options(
        schema.clone(),
        columns,
        &RecordBatchOptions::new().with_row_count(Some(rows)),
    )
    .map_err(|e| error::arrow(e, "assembling the result"))?;
    Ok(Table::new(schema, vec![batch]))
}

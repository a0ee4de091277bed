//! The Arrow C data interface handover: every supported type goes to Polars and back
//! unchanged (values, nulls, exact types after the final cast).

use arrow::array::*;
use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use etlantic_core::data::Table;
use etlantic_polars::interop::{
    array_to_series, dataframe_to_table, polars_type, series_to_array, table_to_dataframe,
};
use etlantic_polars::polars::prelude::DataType as PlType;
use std::sync::Arc;

fn columns() -> Vec<(&'static str, ArrayRef)> {
    let ts = vec![Some(1_704_103_200_123_456i64), None, Some(-1), Some(0)];
    vec![
        (
            "i8",
            Arc::new(Int8Array::from(vec![Some(-128), None, Some(127), Some(0)])) as ArrayRef,
        ),
        (
            "i16",
            Arc::new(Int16Array::from(vec![
                Some(i16::MIN),
                None,
                Some(i16::MAX),
                Some(1),
            ])),
        ),
        (
            "i32",
            Arc::new(Int32Array::from(vec![
                Some(i32::MIN),
                None,
                Some(i32::MAX),
                Some(2),
            ])),
        ),
        (
            "i64",
            Arc::new(Int64Array::from(vec![
                Some(i64::MIN),
                None,
                Some(i64::MAX),
                Some(3),
            ])),
        ),
        (
            "u8",
            Arc::new(UInt8Array::from(vec![Some(0), None, Some(255), Some(4)])),
        ),
        (
            "u16",
            Arc::new(UInt16Array::from(vec![
                Some(0),
                None,
                Some(u16::MAX),
                Some(5),
            ])),
        ),
        (
            "u32",
            Arc::new(UInt32Array::from(vec![
                Some(0),
                None,
                Some(u32::MAX),
                Some(6),
            ])),
        ),
        (
            "u64",
            Arc::new(UInt64Array::from(vec![
                Some(0),
                None,
                Some(u64::MAX),
                Some(7),
            ])),
        ),
        (
            "f32",
            Arc::new(Float32Array::from(vec![
                Some(-0.5),
                None,
                Some(f32::MAX),
                Some(f32::NAN),
            ])),
        ),
        (
            "f64",
            Arc::new(Float64Array::from(vec![
                Some(0.1),
                None,
                Some(f64::INFINITY),
                Some(-0.0),
            ])),
        ),
        (
            "dec",
            Arc::new(
                Decimal128Array::from(vec![Some(1050), None, Some(-99_999_999), Some(0)])
                    .with_precision_and_scale(10, 2)
                    .unwrap(),
            ),
        ),
        (
            "dec38",
            Arc::new(
                Decimal128Array::from(vec![Some(10i128.pow(37)), None, Some(-1), Some(7)])
                    .with_precision_and_scale(38, 10)
                    .unwrap(),
            ),
        ),
        (
            "utf8",
            Arc::new(StringArray::from(vec![
                Some("a"),
                None,
                Some("Ärger ✓"),
                Some(""),
            ])),
        ),
        (
            "large_utf8",
            Arc::new(LargeStringArray::from(vec![
                Some("long string beyond twelve bytes"),
                None,
                Some("x"),
                Some(""),
            ])),
        ),
        (
            "utf8_view",
            Arc::new(StringViewArray::from(vec![
                Some("view"),
                None,
                Some("a string longer than twelve"),
                Some(""),
            ])),
        ),
        (
            "binary",
            Arc::new(BinaryArray::from(vec![
                Some(&b"\x00\x01"[..]),
                None,
                Some(b""),
                Some(b"abc"),
            ])),
        ),
        (
            "bool",
            Arc::new(BooleanArray::from(vec![
                Some(true),
                None,
                Some(false),
                Some(true),
            ])),
        ),
        (
            "date32",
            Arc::new(Date32Array::from(vec![
                Some(19_723),
                None,
                Some(-1),
                Some(0),
            ])),
        ),
        (
            "date64",
            Arc::new(Date64Array::from(vec![
                Some(1_704_067_200_000),
                None,
                Some(0),
                Some(86_400_000),
            ])),
        ),
        (
            "ts_us",
            Arc::new(TimestampMicrosecondArray::from(ts.clone())),
        ),
        (
            "ts_us_utc",
            Arc::new(TimestampMicrosecondArray::from(ts.clone()).with_timezone("UTC")),
        ),
        (
            "ts_ns_zone",
            Arc::new(TimestampNanosecondArray::from(ts.clone()).with_timezone("Europe/Paris")),
        ),
        (
            "ts_ms",
            Arc::new(TimestampMillisecondArray::from(ts.clone()).with_timezone("+02:00")),
        ),
        (
            "ts_s",
            Arc::new(TimestampSecondArray::from(vec![
                Some(1_704_103_200),
                None,
                Some(-1),
                Some(0),
            ])),
        ),
        (
            "dur",
            Arc::new(DurationMicrosecondArray::from(vec![
                Some(5),
                None,
                Some(-5),
                Some(0),
            ])),
        ),
        ("null", Arc::new(NullArray::new(4))),
    ]
}

fn table(columns: &[(&str, ArrayRef)]) -> Table {
    let schema = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let batch = RecordBatch::try_new(
        schema.clone(),
        columns.iter().map(|(_, a)| a.clone()).collect(),
    )
    .unwrap();
    Table::new(schema, vec![batch])
}

#[test]
fn every_supported_type_round_trips() {
    let cols = columns();
    let t = table(&cols);
    let df = table_to_dataframe(&t).unwrap();
    assert_eq!(df.height(), 4);
    // Inside Polars: the documented types.
    let dtype = |n: &str| df.column(n).unwrap().dtype().clone();
    assert_eq!(dtype("i8"), PlType::Int32);
    assert_eq!(dtype("u16"), PlType::UInt32);
    assert_eq!(dtype("dec"), PlType::Decimal(10, 2));
    assert_eq!(dtype("utf8"), PlType::String);
    assert_eq!(dtype("date32"), PlType::Date);
    assert!(matches!(dtype("ts_us_utc"), PlType::Datetime(_, Some(z)) if z.as_str() == "UTC"));
    assert!(matches!(dtype("ts_us"), PlType::Datetime(_, None)));
    for (n, a) in &cols {
        assert_eq!(
            &dtype(n),
            &polars_type(a.data_type()).unwrap(),
            "column {n}"
        );
        assert_eq!(
            df.column(n).unwrap().null_count(),
            a.logical_null_count(),
            "nulls of {n}"
        );
    }
    // And back, in the original schema.
    let back = dataframe_to_table(&df, &t.schema).unwrap();
    assert_eq!(back.schema, t.schema);
    let (a, b) = (&t.batches[0], &back.batches[0]);
    for (i, (n, _)) in cols.iter().enumerate() {
        assert_eq!(a.column(i).to_data(), b.column(i).to_data(), "column {n}");
    }
}

#[test]
fn sliced_and_chunked_inputs_round_trip() {
    let cols = columns();
    let t = table(&cols);
    let b = &t.batches[0];
    // Two batches, the second one a slice (non-zero offsets in every buffer).
    let two = Table::new(t.schema.clone(), vec![b.slice(1, 3), b.slice(0, 2)]);
    let df = table_to_dataframe(&two).unwrap();
    assert_eq!(df.height(), 5);
    let back = dataframe_to_table(&df, &t.schema).unwrap();
    let expected = arrow::compute::concat_batches(&t.schema, &two.batches).unwrap();
    for (i, (name, _)) in cols.iter().enumerate() {
        assert_eq!(
            expected.column(i).to_data(),
            back.batches[0].column(i).to_data(),
            "column {name}"
        );
    }
    // A single sliced array through the series functions.
    let s = array_to_series("x", &cols[12].1.slice(2, 2)).unwrap();
    let a = series_to_array(&s).unwrap();
    let a = arrow::compute::cast(&a, &DataType::Utf8).unwrap();
    assert_eq!(a.as_string::<i32>().value(0), "Ärger ✓");
}

#[test]
fn empty_tables_round_trip() {
    let cols = columns();
    let t = table(&cols);
    let empty = Table::empty(t.schema.clone());
    let df = table_to_dataframe(&empty).unwrap();
    assert_eq!(df.height(), 0);
    assert_eq!(df.width(), cols.len());
    let back = dataframe_to_table(&df, &t.schema).unwrap();
    assert_eq!(back.num_rows(), 0);
    assert_eq!(back.schema, t.schema);
}

#[test]
fn unsupported_types_are_refused() {
    let time: ArrayRef = Arc::new(Time64MicrosecondArray::from(vec![1, 2]));
    let list: ArrayRef = Arc::new(ListArray::from_iter_primitive::<
        arrow::datatypes::Int32Type,
        _,
        _,
    >(vec![Some(vec![Some(1)]), None]));
    for (n, a) in [("time", time), ("list", list)] {
        let e = table_to_dataframe(&table(&[(n, a)])).unwrap_err();
        assert_eq!(e.code(), "ETL501", "{n}: {e}");
    }
    assert!(polars_type(&DataType::Timestamp(TimeUnit::Second, None)).is_some());
}

#[test]
fn results_cast_to_the_promised_schema_and_fail_instead_of_losing_values() {
    let t = table(&[("v", Arc::new(Int64Array::from(vec![1, 300])) as ArrayRef)]);
    let df = table_to_dataframe(&t).unwrap();
    let narrow = Arc::new(Schema::new(vec![Field::new("v", DataType::Int16, false)]));
    let ok = dataframe_to_table(&df, &narrow).unwrap();
    assert_eq!(ok.batches[0].column(0).data_type(), &DataType::Int16);
    let tiny = Arc::new(Schema::new(vec![Field::new("v", DataType::Int8, true)]));
    assert_eq!(dataframe_to_table(&df, &tiny).unwrap_err().code(), "ETL707");
    let missing = Arc::new(Schema::new(vec![Field::new("w", DataType::Int8, true)]));
    assert_eq!(
        dataframe_to_table(&df, &missing).unwrap_err().code(),
        "ETL707"
    );
}

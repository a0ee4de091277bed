//! Unit tests of the delta sink: binding options and the Delta types of a schema.

use super::*;
use arrow::datatypes::{DataType, Schema, TimeUnit};

#[test]
fn options() {
    let o = DeltaSinkOptions::from_uri(&BindingUri::parse("delta://t").unwrap()).unwrap();
    assert_eq!(o.mode, DeltaWriteMode::Append);
    assert!(!o.change_data_feed);
    let o = DeltaSinkOptions::from_uri(
        &BindingUri::parse("delta://t?mode=merge&keys=a,%20b&change_data_feed=true").unwrap(),
    )
    .unwrap();
    assert_eq!(
        o.mode,
        DeltaWriteMode::Merge {
            keys: vec!["a".into(), "b".into()]
        }
    );
    assert!(o.change_data_feed);
    assert!(o.output_modes().contains(&OutputMode::Update));
    for bad in [
        "delta://t?mode=merge",
        "delta://t?keys=a",
        "delta://t?mode=upsertish",
        "delta://t?x=1",
        "delta://?mode=append",
        "delta://t?change_data_feed=maybe",
    ] {
        let e = DeltaSinkOptions::from_uri(&BindingUri::parse(bad).unwrap()).unwrap_err();
        assert_eq!(e.code(), "ETL007", "{bad}");
    }
}

#[test]
fn timestamps_map_to_delta_types() {
    use arrow::datatypes::Field;
    let s = Schema::new(vec![
        Field::new(
            "a",
            DataType::Timestamp(TimeUnit::Millisecond, Some("+02:00".into())),
            true,
        ),
        Field::new("b", DataType::Timestamp(TimeUnit::Nanosecond, None), true),
        Field::new("c", DataType::Int64, false),
    ]);
    let d = delta_schema(&s);
    assert_eq!(
        d.field(0).data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    );
    assert_eq!(
        d.field(1).data_type(),
        &DataType::Timestamp(TimeUnit::Microsecond, None)
    );
    assert_eq!(d.field(2).data_type(), &DataType::Int64);
}

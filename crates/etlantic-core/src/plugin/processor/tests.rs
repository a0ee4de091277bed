//! Unit tests of typed state, TTL, timers and emission through a callback context, and
//! of keys and rows as JSON.

use super::*;
use crate::streaming::{ExecutionMode, OutputMode};
use serde::{Deserialize, Serialize};
use std::marker::PhantomData;

#[derive(Serialize, Deserialize, Debug, PartialEq, Clone)]
struct Counter {
    n: u64,
}

fn ctx<'a>(
    state: &'a mut KeyState,
    decls: &'a [StateDecl],
    now: i64,
    firing: Option<i64>,
    out: &'a mut Vec<Emitted>,
    counters: &'a mut ProcessorCounters,
) -> ProcessorContext<'a> {
    ProcessorContext::new(
        state,
        decls,
        TimeMode::EventTime,
        OutputMode::Append,
        TimerValues {
            processing_time_ms: now,
            watermark_ms: Some(0),
        },
        firing,
        out,
        counters,
    )
}

#[test]
fn typed_state_with_ttl_timers_and_emission() {
    let mut init = ProcessorInit::new(TimeMode::EventTime, ExecutionMode::Streaming);
    let count = init
        .value_state::<Counter>("count", Some(Duration::from_secs(10)))
        .unwrap();
    let seen = init.list_state::<String>("seen", None).unwrap();
    let by = init.map_state::<String, i64>("by", None).unwrap();
    assert!(init.value_state::<u8>("count", None).is_err());
    let decls = init.into_decls();
    let mut state = KeyState::new(decls.len());
    let (mut out, mut counters) = (Vec::new(), ProcessorCounters::default());
    {
        let mut c = ctx(&mut state, &decls, 1_000, None, &mut out, &mut counters);
        assert_eq!(count.get(&c).unwrap(), None);
        count.set(&mut c, &Counter { n: 2 }).unwrap();
        seen.append(&mut c, &"a".into()).unwrap();
        seen.append(&mut c, &"b".into()).unwrap();
        by.put(&mut c, &"x".into(), &5).unwrap();
        by.put(&mut c, &"a".into(), &1).unwrap();
        c.register_timer(50).unwrap();
        c.register_timer(20).unwrap();
        c.emit(&serde_json::json!({"k": 1})).unwrap();
        assert!(c.emit(&3).is_err());
        assert_eq!(c.list_timers(), [20, 50]);
        assert_eq!(seen.get(&c).unwrap(), ["a", "b"]);
        assert_eq!(
            by.entries(&c).unwrap(),
            [("a".to_string(), 1), ("x".to_string(), 5)]
        );
    }
    assert_eq!(state.entries(), 5);
    assert_eq!(counters.timers_registered, 2);
    assert_eq!(counters.rows_written, 5);
    assert_eq!(out.len(), 1);
    {
        // 10 s later the value expired (reads hide it at once); lists and maps have no TTL.
        let mut c = ctx(
            &mut state,
            &decls,
            11_000,
            Some(20),
            &mut out,
            &mut counters,
        );
        assert_eq!(count.get(&c).unwrap(), None);
        assert!(!count.exists(&c).unwrap());
        assert!(c.register_timer(20).is_err(), "not after the firing timer");
        c.delete_timer(50);
        by.remove(&mut c, &"x".into()).unwrap();
    }
    assert_eq!(state.expire(11_000), 1);
    assert_eq!(state.entries(), 3);
    assert_eq!((counters.rows_removed, counters.timers_deleted), (1, 1));
    assert!(!state.is_empty());
    // Handles of another kind are refused.
    let wrong: ValueState<u8> = ValueState {
        id: 1,
        _t: PhantomData,
    };
    let c = ctx(&mut state, &decls, 0, None, &mut out, &mut counters);
    assert!(wrong.get(&c).is_err());
}

#[test]
fn keys_and_rows_as_json() {
    use arrow::array::{Int64Array, StringArray};
    let b = RecordBatch::try_from_iter(vec![
        (
            "user",
            std::sync::Arc::new(StringArray::from(vec![Some("u1")])) as _,
        ),
        (
            "n",
            std::sync::Arc::new(Int64Array::from(vec![None::<i64>])) as _,
        ),
    ])
    .unwrap();
    let k = GroupKey::new(b.clone()).unwrap();
    assert_eq!(k.get("user"), Some(&Value::from("u1")));
    assert_eq!(k.get("n"), Some(&Value::Null));
    let rows = rows_as_json(&b).unwrap();
    assert_eq!(rows[0]["n"], Value::Null);
    assert_eq!(iso_millis(0), "1970-01-01T00:00:00.000Z");
}

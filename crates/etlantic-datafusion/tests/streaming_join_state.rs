//! The state of a stream-stream join in the checkpoint: changes between whole snapshots,
//! a state checkpoint interval, and restarts that rebuild the state, giving the same rows
//! as a run without restarts.

mod common;
mod streaming_support;

use etlantic_core::streaming::OutputMode;
use etlantic_runtime::{ManualClock, StreamingOptions};
use serde_json::{json, Value};
use streaming_support::joins::*;
use streaming_support::*;

/// The file names in the state directory of the checkpoint's (only) stateful operator.
/// The versions the join's changes are logged for in the state changelog.
fn logged_versions(fx: &Fixture) -> Vec<u64> {
    let logged = etlantic_runtime::checkpoint::state_log::logged_versions(
        &fx.checkpoint().join("state-changes"),
    )
    .expect("the state changelog");
    assert_eq!(logged.len(), 1, "one operator: {logged:?}");
    logged.into_values().next().expect("one operator")
}

/// The files of the join's state directory (none before its first whole snapshot).
fn state_file_names(fx: &Fixture) -> Vec<String> {
    // The directory appears with the first snapshot.
    let Ok(mut state) = std::fs::read_dir(fx.checkpoint().join("state")) else {
        return Vec::new();
    };
    let Some(dir) = state.next().map(|d| d.unwrap().path()) else {
        return Vec::new();
    };
    std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Feeds 14 scenario batches (an impression and a click a second later on one of three
/// ads, 5 s apart), restarting the query before the feeds in `restarts`; returns the
/// rows each feed emitted and the state size after it.
async fn long_run(fx: &Fixture, restarts: &[usize]) -> Vec<(Vec<String>, u64)> {
    feeding_run(fx, 14, restarts, || fx.options(), None).await
}

/// `batches` micro-batches of one impression and one click (ads a0..a2 in turn), the
/// query started with `options()` and restarted before each micro-batch in `restarts`;
/// the new output rows and the state size of each micro-batch. With `clock`, it is moved
/// 3 s on before each micro-batch.
async fn feeding_run(
    fx: &Fixture,
    batches: usize,
    restarts: &[usize],
    options: impl Fn() -> StreamingOptions,
    clock: Option<&ManualClock>,
) -> Vec<(Vec<String>, u64)> {
    let mut got = Vec::new();
    let mut run = fx.start_with(options()).await;
    for k in 0..batches {
        if let Some(c) = clock {
            c.advance(3_000);
        }
        if restarts.contains(&k) {
            drop(run);
            run = fx.start_with(options()).await;
            run.new_rows("out");
        }
        let ad = format!("a{}", k % 3);
        let t = 5 * k as i64;
        run.feed(&[
            ("imps", vec![imp(t, &ad)]),
            ("clicks", vec![click(t + 1, &ad)]),
        ])
        .await;
        let state = op(
            run.progress().last().expect("a micro-batch"),
            "numRowsTotal",
        );
        got.push((run.new_rows("out"), state));
    }
    // Closing waits for a whole snapshot being written in the background.
    run.query.close().await.expect("the query closes");
    got
}

#[tokio::test]
async fn join_state_is_checkpointed_as_changes_between_whole_snapshots() {
    let reference = long_run(
        &join_fixture(
            "ssj_log_ref",
            "left",
            Some("10 seconds"),
            Some("5 seconds"),
            RANGE,
        ),
        &[],
    )
    .await;
    assert!(reference.iter().any(|(r, _)| !r.is_empty()));
    // Restarts before, at and after the whole snapshot of version 10, each restoring
    // from a snapshot with changes applied (or from changes alone).
    let fx = join_fixture(
        "ssj_log",
        "left",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let got = long_run(&fx, &[3, 5, 6, 9, 12]).await;
    assert_eq!(got, reference);
    let names = state_file_names(&fx);
    assert!(names.contains(&"10.arrow".to_string()), "{names:?}");
    assert!(logged_versions(&fx).contains(&11));
    assert!(!names.contains(&"11.arrow".to_string()), "{names:?}");
}

/// Under a state checkpoint interval (10 s here, with micro-batches 3 s apart) only every
/// fourth micro-batch writes the join's state, as changes since the previous write. A
/// restart restores the newest written version and runs the committed micro-batches after
/// it again, through the join only: the output and the state equal a run without
/// restarts, and no sink gets a micro-batch twice.
#[tokio::test]
async fn a_state_checkpoint_interval_writes_state_now_and_then_and_restarts_rebuild_it() {
    let fixture = |name: &str| {
        join_fixture(name, "left", Some("10 seconds"), Some("5 seconds"), RANGE).with_profile(|p| {
            p.state_checkpoint_interval = Some("10 seconds".parse().expect("duration"))
        })
    };
    let reference = long_run(&fixture("ssj_interval_ref"), &[]).await;
    assert!(reference.iter().any(|(r, _)| !r.is_empty()));
    let fx = fixture("ssj_interval");
    let clock = ManualClock::new(0);
    let options = || {
        let mut opts = fx.options();
        opts.clock = clock.clock();
        opts
    };
    // Restarts right after a state write (5), between writes (7, 10) and twice in a row.
    let got = feeding_run(&fx, 14, &[5, 7, 10, 11], options, Some(&clock)).await;
    assert_eq!(got, reference);
    let run = fx.start_with(options()).await;
    let batches = run.written_batches("out");
    assert!(batches.windows(2).all(|w| w[0] < w[1]), "{batches:?}");
    drop(run);
    // Feed k runs at 3(k+1) s: the state is written at 12 s (k = 3), 24 s (7) and 36 s
    // (11), each 10 s or more after the previous write (a restart counts from the write
    // it restored, not from its start); the other micro-batches write none.
    let mut versions: Vec<u64> = state_file_names(&fx)
        .iter()
        .filter_map(|n| n.split('.').next()?.parse().ok())
        .chain(logged_versions(&fx))
        .collect();
    versions.sort_unstable();
    versions.dedup();
    assert_eq!(versions.len(), 3, "{versions:?}");
    let log = etlantic_runtime::checkpoint::batch_log::read_all(&fx.checkpoint().join("log"))
        .expect("the log");
    let (_, last) = log.commits.last_key_value().expect("a commit");
    let entry = serde_json::to_value(last).expect("JSON");
    assert_eq!(
        entry["stateVersion"].as_u64(),
        versions.last().copied(),
        "{entry}"
    );
}

/// [`feeding_run`] over 32 micro-batches with whole snapshots written before the commit,
/// so which versions have one does not depend on how fast a background write finishes.
async fn growing_run(fx: &Fixture, restarts: &[usize]) -> Vec<(Vec<String>, u64)> {
    feeding_run(
        fx,
        32,
        restarts,
        || {
            let mut opts = fx.options();
            opts.background_snapshots = false;
            opts
        },
        None,
    )
    .await
}

/// A join state that only grows (no watermark on either side) is not rewritten whole on
/// every tenth version: each whole snapshot waits until the changes since the last one
/// are half the state. With two rows a micro-batch, versions 10 and 20 are snapshotted,
/// 30 is not (20 changed rows against 60 held). A restart after version 30 then restores
/// version 20's snapshot with ten versions of changes applied, and goes on like a run
/// without restarts.
#[tokio::test]
async fn a_growing_join_state_is_snapshotted_as_it_doubles_and_restores_from_the_chain() {
    let reference = growing_run(&join_fixture("ssj_grow_ref", "inner", None, None, ""), &[]).await;
    // Nothing is evicted: the state holds every row fed.
    assert_eq!(reference.last().map(|(_, s)| *s), Some(64));
    let fx = join_fixture("ssj_grow", "inner", None, None, "");
    let got = growing_run(&fx, &[31]).await;
    assert_eq!(got, reference);
    let names = state_file_names(&fx);
    for whole in ["10.arrow", "20.arrow"] {
        assert!(names.contains(&whole.to_string()), "{names:?}");
    }
    assert!(!names.contains(&"30.arrow".to_string()), "{names:?}");
    let logged = logged_versions(&fx);
    for changes in [21, 30, 32] {
        assert!(logged.contains(&changes), "{logged:?}");
    }
}

/// [`join_fixture`] with 10/5-second watermarks and [`RANGE`], the impressions' contract
/// declaring `ad_id` its primary key (one impression per ad).
fn keyed_join_fixture(name: &str, how: &str) -> Fixture {
    imps_and_clicks(
        name,
        Src::new("imps")
            .watermark("imp_ts", "10 seconds")
            .primary_key(&["ad_id"]),
        Src::new("clicks").watermark("click_ts", "5 seconds"),
        &ranged_join(how),
    )
}

/// With one impression per ad declared, a click that has met its impression is not
/// kept (no other impression can come for it), nor is an impression's earlier click
/// once the impression came (an inner join's unmatched rows too: their one partner has
/// passed): the join keeps fewer rows and outputs exactly the same, for every join type
/// and across a restart.
#[tokio::test]
async fn a_declared_unique_key_keeps_less_state_and_the_same_output() {
    for how in ["inner", "left", "right", "full"] {
        let plain = run_scenario(&join_fixture(
            &format!("ssj_plain_{how}"),
            how,
            Some("10 seconds"),
            Some("5 seconds"),
            RANGE,
        ))
        .await;
        let keyed = run_scenario(&keyed_join_fixture(&format!("ssj_keyed_{how}"), how)).await;
        for (i, (p, k)) in plain.iter().zip(&keyed).enumerate() {
            assert_eq!(k.0, p.0, "{how}: rows of batch {i}");
            assert_eq!((k.2, k.3), (p.2, p.3), "{how}: late rows, micro-batches");
            assert!(
                k.1 <= p.1,
                "{how}: state rows after batch {i}: {} > {}",
                k.1,
                p.1
            );
        }
        let held = |r: &[(Vec<String>, u64, u64, u64)]| r.iter().map(|b| b.1).sum::<u64>();
        assert!(
            held(&keyed) < held(&plain),
            "{how}: {} state rows in all, {} without the key",
            held(&keyed),
            held(&plain)
        );
    }

    // A restart between every batch gives the same rows.
    let reference = run_scenario(&keyed_join_fixture("ssj_keyed_ref", "left")).await;
    let fx = keyed_join_fixture("ssj_keyed_restart", "left");
    for (i, (imps, clicks)) in scenario().into_iter().enumerate() {
        let mut run = fx.start().await;
        run.new_rows("out");
        run.feed(&[("imps", imps), ("clicks", clicks)]).await;
        assert_eq!(run.new_rows("out"), reference[i].0, "batch {i}");
    }
}

/// A second impression of an ad whose first the join still holds breaks the contract's
/// primary key: it is quarantined (ETL704, with the key named) and joins nothing, so
/// the output is that of the stream without it.
#[tokio::test]
async fn a_repeated_unique_key_is_quarantined_not_joined() {
    let fx = keyed_join_fixture("ssj_keyed_repeat", "inner");
    let mut run = fx.start().await;
    run.feed(&[("imps", vec![imp(0, "a"), imp(2, "b")]), ("clicks", vec![])])
        .await;
    run.feed(&[
        ("imps", vec![imp(3, "a")]),
        ("clicks", vec![click(5, "a"), click(6, "b")]),
    ])
    .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[
            out(Some((0, "a")), Some((5, "a"))),
            out(Some((2, "b")), Some((6, "b"))),
        ])
    );
    let lines = fx.quarantined();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["code"], "ETL704");
    assert!(
        lines[0]["reason"]
            .as_str()
            .unwrap()
            .contains("duplicate key (ad_id)"),
        "{}",
        lines[0]["reason"]
    );
    let raw: Value = serde_json::from_str(lines[0]["raw"].as_str().unwrap()).unwrap();
    assert_eq!(raw["ad_id"], "a");
    // The second `a`, not the first (the quarantine writes whole seconds without
    // fractions).
    assert_eq!(raw["imp_ts"].as_str().unwrap()[..19], ts(3)[..19]);
    let p = run.progress();
    let sum = |at: &str| {
        p.iter()
            .filter_map(|p| p.pointer(at)?.as_u64())
            .sum::<u64>()
    };
    assert_eq!(sum("/quarantinedRows"), 1, "{p:?}");
    // Both clicks met their impression, held in state: neither is kept.
    assert_eq!(
        sum("/stateOperators/0/customMetrics/numRowsReleasedByUniqueKey"),
        2,
        "{p:?}"
    );
}

/// The join's inputs are pruned to the columns it and the `select` after it read, but a
/// unique side keeps all of its columns: a repeated key's row is quarantined whole, with
/// `campaign` too, which nothing after the join reads.
#[tokio::test]
async fn a_repeated_unique_key_is_quarantined_with_the_columns_the_join_does_not_read() {
    const CAMPAIGN_IMPS: &[(&str, &str)] = &[
        ("ad_id", "string"),
        ("imp_ts", "timestamp"),
        ("campaign", "string"),
    ];
    const NARROW: &[(&str, &str)] = &[("ad_id", "string"), ("click_ts", "timestamp")];
    let fx = Fixture::new("ssj_keyed_repeat_whole")
        .source(Src {
            cols: CAMPAIGN_IMPS,
            ..Src::new("imps")
                .watermark("imp_ts", "10 seconds")
                .primary_key(&["ad_id"])
        })
        .source(Src {
            cols: CLICKS,
            ..Src::new("clicks").watermark("click_ts", "5 seconds")
        })
        .transform_yaml(
            "joined",
            &["imps", "clicks"],
            &[&ranged_join("inner"), "select: [ad_id, click_ts]"],
        )
        .sink("out", "joined", NARROW, OutputMode::Append);
    let campaign_imp = |secs: i64, ad: &str, campaign: &str| json!({"ad_id": ad, "imp_ts": ts(secs), "campaign": campaign});
    let mut run = fx.start().await;
    run.feed(&[
        ("imps", vec![campaign_imp(0, "a", "spring")]),
        ("clicks", vec![]),
    ])
    .await;
    run.feed(&[
        ("imps", vec![campaign_imp(3, "a", "summer")]),
        ("clicks", vec![click(5, "a")]),
    ])
    .await;
    assert_eq!(
        run.new_rows("out"),
        rows(&[json!({"ad_id": "a", "click_ts": ts(5)})])
    );
    let lines = fx.quarantined();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert_eq!(lines[0]["code"], "ETL704");
    let raw: Value = serde_json::from_str(lines[0]["raw"].as_str().unwrap()).unwrap();
    assert_eq!(raw["ad_id"], "a", "{raw}");
    assert_eq!(raw["campaign"], "summer", "{raw}");
}

/// Without a unique key the join reports no unique-key metric.
#[tokio::test]
async fn a_join_without_a_unique_side_has_no_unique_key_metric() {
    let fx = join_fixture(
        "ssj_plain_metric",
        "inner",
        Some("10 seconds"),
        Some("5 seconds"),
        RANGE,
    );
    let mut run = fx.start().await;
    run.feed(&[("imps", vec![imp(0, "a")]), ("clicks", vec![click(5, "a")])])
        .await;
    let p = run.progress();
    let op = &p.last().unwrap()["stateOperators"][0];
    assert!(
        op["customMetrics"]["numRowsReleasedByUniqueKey"].is_null(),
        "{op}"
    );
}

//! Unit tests of the Nexmark generator: stream membership, replay, Beam's distributions,
//! bindings, realtime pacing and the shapes of string columns.

use super::*;
use arrow::array::{Array, StringArray};
use arrow::datatypes::{Field, Schema, TimeUnit};
use etlantic_core::streaming::ExecutionMode;

fn source(uri: &str, cols: &[(&str, DataType)]) -> Result<NexmarkSource> {
    let schema = Arc::new(Schema::new(
        cols.iter()
            .map(|(n, t)| Field::new(*n, t.clone(), true))
            .collect::<Vec<_>>(),
    ));
    NexmarkSource::new(SourceContext {
        storage_options: Default::default(),
        asset: "a".into(),
        uri: BindingUri::parse(uri).unwrap(),
        schema,
        contract: None,
        root: ".".into(),
        mode: ExecutionMode::Streaming,
        state: None,
    })
}

fn ts() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
}

fn ints(b: &RecordBatch, col: usize) -> Vec<i64> {
    b.column(col)
        .as_any()
        .downcast_ref::<Int64Array>()
        .unwrap()
        .values()
        .to_vec()
}

async fn read_all(s: &mut NexmarkSource) -> Vec<RecordBatch> {
    let end = s
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    s.read(None, &end).await.unwrap().batches
}

#[test]
fn tabulated_positions_are_those_whose_event_is_of_the_stream() {
    for stream in ["persons", "auctions", "bids"] {
        for g in [1u64, 7, 50, 64, 1_000] {
            let s = source(
                &format!("nexmark://{stream}?events_per_batch=100&start_ms=0&out_of_order={g}"),
                &[("date_time", ts())],
            )
            .unwrap();
            assert!(
                s.own.period > 0
                    && s.own.period.is_multiple_of(g)
                    && s.own.period.is_multiple_of(50)
            );
            for (from, to) in [(0, 1), (0, 5_000), (17, 4_013), (123_456, 130_001), (9, 9)] {
                let scanned: Vec<u64> = (from..to).filter(|n| s.is_ours(*n)).collect();
                assert_eq!(
                    s.positions(from, to),
                    scanned,
                    "{stream} g={g} {from}..{to}"
                );
            }
        }
    }
}

#[tokio::test]
async fn streams_share_one_event_sequence_and_replay() {
    let mut auctions = source(
        "nexmark://auctions?events_per_batch=100&start_ms=0&out_of_order=1",
        &[("id", DataType::Int64), ("date_time", ts())],
    )
    .unwrap();
    let mut bids = source(
        "nexmark://bids?events_per_batch=100&start_ms=0&out_of_order=1",
        &[
            ("auction", DataType::Int64),
            ("date_time", ts()),
            ("price", DataType::Int32),
        ],
    )
    .unwrap();
    let end = auctions
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(end.0, serde_json::json!(100));
    let a = auctions.read(None, &end).await.unwrap();
    // Events 1-3 and 51-53 are auctions 1000..1006, at 100 µs per event.
    assert_eq!(a.num_rows(), 6);
    assert_eq!(ints(&a.batches[0], 0), [1000, 1001, 1002, 1003, 1004, 1005]);
    let b = bids.read(None, &end).await.unwrap();
    assert_eq!(b.num_rows(), 92);
    assert_eq!(b.batches[0].column(2).data_type(), &DataType::Int32);
    // Bids go to auctions in flight, or at most 10 ahead of the newest (Beam's lead).
    assert!(ints(&b.batches[0], 0)[..46]
        .iter()
        .all(|x| (1000..=1012).contains(x)));
    // Deterministic: the same range gives the same rows.
    let again = bids.read(None, &end).await.unwrap();
    assert_eq!(again.batches, b.batches);
    // max_events stops the stream.
    let mut capped = source(
        "nexmark://bids?events_per_batch=100&max_events=150",
        &[("price", DataType::Int64)],
    )
    .unwrap();
    let o = capped
        .latest_offset(Some(&end), &ReadLimit::unlimited())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(o.0, serde_json::json!(150));
    assert_eq!(
        capped
            .latest_offset(Some(&o), &ReadLimit::unlimited())
            .await
            .unwrap(),
        Some(o)
    );
}

/// Beam's mix, hot items, categories and out-of-order groups, over 100 000 events.
#[tokio::test]
async fn the_distributions_are_beams() {
    let opts = "events_per_batch=100000&start_ms=0";
    let mut bids = source(
        &format!("nexmark://bids?{opts}"),
        &[
            ("auction", DataType::Int64),
            ("bidder", DataType::Int64),
            ("price", DataType::Int64),
            ("date_time", ts()),
        ],
    )
    .unwrap();
    let mut auctions = source(
        &format!("nexmark://auctions?{opts}"),
        &[
            ("id", DataType::Int64),
            ("seller", DataType::Int64),
            ("category", DataType::Int64),
        ],
    )
    .unwrap();
    let mut persons = source(
        &format!("nexmark://persons?{opts}"),
        &[
            ("id", DataType::Int64),
            ("state", DataType::Utf8),
            ("extra", DataType::Utf8),
        ],
    )
    .unwrap();
    let count = |b: &[RecordBatch]| b.iter().map(|b| b.num_rows()).sum::<usize>();
    let (b, a, p) = (
        read_all(&mut bids).await,
        read_all(&mut auctions).await,
        read_all(&mut persons).await,
    );
    // 1:3:46 exactly: out-of-order groups permute ids within 50 positions.
    assert_eq!((count(&p), count(&a), count(&b)), (2_000, 6_000, 92_000));
    let all = |batches: &[RecordBatch], col: usize| -> Vec<i64> {
        batches.iter().flat_map(|b| ints(b, col)).collect()
    };
    let share = |v: &[i64], f: &dyn Fn(i64) -> bool| {
        v.iter().filter(|x| f(**x)).count() as f64 / v.len() as f64
    };
    let auction = all(&b, 0);
    let bidder = all(&b, 1);
    let hot_auction = share(&auction, &|x| x % 100 == 0);
    let hot_bidder = share(&bidder, &|x| x % 100 == 1);
    assert!(
        (0.48..0.53).contains(&hot_auction),
        "hot auctions {hot_auction}"
    );
    assert!(
        (0.73..0.77).contains(&hot_bidder),
        "hot bidders {hot_bidder}"
    );
    let seller = all(&a, 1);
    let hot_seller = share(&seller, &|x| x % 100 == 0);
    assert!(
        (0.73..0.77).contains(&hot_seller),
        "hot sellers {hot_seller}"
    );
    let cats = all(&a, 2);
    assert!(cats.iter().all(|c| (10..15).contains(c)));
    // Prices: 10^(6u) dollars, so the median is about $1000.
    let mut prices = all(&b, 2);
    prices.sort();
    let median = prices[prices.len() / 2];
    assert!((50_000..200_000).contains(&median), "median price {median}");
    // Out of order: auction ids do not ascend with time, but every id 1000.. appears
    // once.
    let ids = all(&a, 0);
    assert!(
        ids.windows(2).any(|w| w[1] < w[0]),
        "ids arrive out of order"
    );
    let mut sorted = ids.clone();
    sorted.sort();
    assert_eq!(sorted, (1000..7000).collect::<Vec<i64>>());
    // Persons' states are Beam's six; `extra` pads a person to ~200 bytes.
    let states = p[0]
        .column(1)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    assert!(states
        .iter()
        .all(|s| ["AZ", "CA", "ID", "OR", "WA", "WY"].contains(&s.unwrap())));
    let extra = p[0]
        .column(2)
        .as_any()
        .downcast_ref::<StringArray>()
        .unwrap();
    let avg = extra.iter().map(|s| s.unwrap().len()).sum::<usize>() / extra.len();
    assert!((100..140).contains(&avg), "extra {avg}");
    // Another seed, other prices; the same seed, the same.
    let mut other = source(
        &format!("nexmark://bids?{opts}&seed=7"),
        &[("price", DataType::Int64)],
    )
    .unwrap();
    let o = all(&read_all(&mut other).await, 0);
    assert_ne!(o[..100], all(&b, 2)[..100]);
    assert_eq!(all(&read_all(&mut bids).await, 2), all(&b, 2));
}

#[test]
fn bad_bindings_and_columns_are_refused() {
    assert!(source("nexmark://bids?realtime=sometimes", &[]).is_err());
    assert!(source("nexmark://trades", &[]).is_err());
    assert!(source("nexmark://bids?speed=3", &[]).is_err());
    let e = source("nexmark://bids", &[("seller", DataType::Int64)]).unwrap_err();
    assert_eq!(e.code(), "ETL301");
}

#[tokio::test]
async fn realtime_offers_only_the_events_whose_time_has_passed() {
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Started 1 s ago at one event per ms: about 1000 positions are due, not the
    // 1 000 000 a trigger would otherwise offer.
    let uri = format!(
        "nexmark://bids?events_per_batch=1000000&event_gap_us=1000&start_ms={}&realtime=true",
        now_ms - 1000
    );
    let mut s = source(&uri, &[("date_time", ts())]).unwrap();
    let end = s
        .latest_offset(None, &ReadLimit::unlimited())
        .await
        .unwrap();
    let end = end.map(|o| parse(&o).unwrap()).unwrap();
    assert!((1000..2000).contains(&end), "{end} positions offered");
    // A start in the future offers nothing yet.
    let uri = format!(
        "nexmark://bids?event_gap_us=1000&start_ms={}&realtime=true",
        now_ms + 60_000
    );
    let mut s = source(&uri, &[("date_time", ts())]).unwrap();
    assert_eq!(
        s.latest_offset(None, &ReadLimit::unlimited())
            .await
            .unwrap(),
        None
    );
}

#[test]
fn digits_are_written_zero_padded() {
    let mut s = String::new();
    push_digits(&mut s, 42, 4);
    push_digits(&mut s, 0, 1);
    push_digits(&mut s, 12_345, 1);
    assert_eq!(s, "0042012345");
}

#[tokio::test]
async fn string_columns_have_their_shapes() {
    let mut persons = source(
        "nexmark://persons?events_per_batch=5000&start_ms=0",
        &[
            ("name", DataType::Utf8),
            ("credit_card", DataType::Utf8),
            ("email_address", DataType::Utf8),
        ],
    )
    .unwrap();
    let b = &read_all(&mut persons).await[0];
    let col = |i: usize| {
        b.column(i)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap()
            .clone()
    };
    let (names, cards, emails) = (col(0), col(1), col(2));
    for i in 0..b.num_rows() {
        assert_eq!(names.value(i).split(' ').count(), 2);
        let card = cards.value(i);
        assert_eq!(card.len(), 19, "{card}");
        assert!(card
            .split(' ')
            .all(|g| g.len() == 4 && g.bytes().all(|c| c.is_ascii_digit())));
        assert!(emails.value(i).ends_with(".com"));
    }
    let mut bids = source(
        "nexmark://bids?events_per_batch=5000&start_ms=0",
        &[("channel", DataType::Utf8), ("url", DataType::Utf8)],
    )
    .unwrap();
    let b = &read_all(&mut bids).await[0];
    let channel = b.column(0).as_any().downcast_ref::<StringArray>().unwrap();
    let url = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
    for i in 0..b.num_rows() {
        assert!(url.value(i).starts_with("https://www.nexmark.com/"));
        let id = url.value(i).rsplit_once("channel_id=").unwrap().1;
        match channel.value(i).strip_prefix("channel-") {
            Some(n) => assert_eq!(n, id),
            None => assert!(HOT_CHANNELS.contains(&channel.value(i))),
        }
    }
}

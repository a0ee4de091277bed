//! The `nexmark://<stream>` generator: the three streams of the Nexmark auction
//! benchmark (persons, auctions, bids), deterministic and replayable.
//!
//! `nexmark://bids?events_per_batch=100000&max_events=10000000&event_gap_us=100&start_ms=T`
//!
//! All three streams share one global event sequence, like the Nexmark generator: of
//! every 50 events, event 0 is a person, 1-3 are auctions and 4-49 are bids. Event `n`
//! happens at `start_ms + n * event_gap_us` (µs). A stream returns the events of its
//! kind; its offset is the number of *global* events consumed (a JSON number), so that
//! sources of different streams bound to the same options advance through the same
//! event time. Values come from a hash of the event number (no state, no wall clock):
//!
//! - person `id` (= person number), `name`, `city`, `date_time`;
//! - auction `id` (= auction number), `seller` (a person seen so far), `category`
//!   (0..10), `initial_bid`, `date_time`, `expires` (`date_time` + 10..20 s);
//! - bid `auction` (one of the 100 most recent auctions), `bidder` (a person seen so
//!   far), `price` (cents), `date_time`.
//!
//! Every trigger offers `events_per_batch` more events (default 10 000), up to
//! `max_events` (default unlimited); a `max_records` read limit caps it too. The
//! contract may hold any subset of a stream's columns (by name); timestamps may use any
//! unit and time zone, integers any integer type. The source is unbounded only.

use arrow::array::{ArrayRef, Int64Array, RecordBatch, RecordBatchOptions, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, SchemaRef};
use etlantic_core::data::Offset;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use std::sync::Arc;

/// Events generated per chunk of `read`.
const CHUNK_EVENTS: u64 = 50 * 4096;
/// Events per Nexmark epoch (1 person, 3 auctions, 46 bids).
const EPOCH: u64 = 50;
/// Bids go to one of this many most recent auctions.
const HOT_AUCTIONS: u64 = 100;

/// The provider of `nexmark://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct NexmarkSourceProvider;

inventory::submit! { SourceRegistration(&NexmarkSourceProvider) }

/// A Nexmark stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// People registering.
    Persons,
    /// Auctions opening.
    Auctions,
    /// Bids on auctions.
    Bids,
}

/// The options of a `nexmark://` binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NexmarkOptions {
    /// Which stream.
    pub stream: Stream,
    /// Global events offered per trigger.
    pub events_per_batch: u64,
    /// Global events in all (`None`: unlimited).
    pub max_events: Option<u64>,
    /// Event time between consecutive global events (µs).
    pub event_gap_us: i64,
    /// Event time of event 0 (epoch ms).
    pub start_ms: i64,
}

impl NexmarkOptions {
    /// Parses the stream (`persons`, `auctions`, `bids`) and the parameters; anything
    /// else is an error (`ETL007`).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let stream = match uri.location.trim_matches('/') {
            "persons" | "person" => Stream::Persons,
            "auctions" | "auction" => Stream::Auctions,
            "bids" | "bid" => Stream::Bids,
            other => {
                return Err(Error::new(
                    &codes::BAD_URI,
                    format!(
                        "`{uri}`: unknown Nexmark stream `{other}` (persons, auctions or bids)"
                    ),
                ))
            }
        };
        let mut o = NexmarkOptions {
            stream,
            events_per_batch: 10_000,
            max_events: None,
            event_gap_us: 100,
            start_ms: 1_704_067_200_000,
        };
        let bad = |k: &str, v: &str, what: &str| {
            Error::new(
                &codes::BAD_URI,
                format!("`{uri}`: parameter `{k}={v}` is invalid, expected {what}"),
            )
        };
        for (k, v) in &uri.params {
            let positive = || {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| bad(k, v, "a positive integer"))
            };
            match k.as_str() {
                "events_per_batch" => o.events_per_batch = positive()?,
                "max_events" => o.max_events = Some(positive()?),
                "event_gap_us" => o.event_gap_us = positive()? as i64,
                "start_ms" => {
                    o.start_ms = v.parse().map_err(|_| bad(k, v, "epoch milliseconds"))?
                }
                other => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!("`{uri}`: unknown parameter `{other}` for the Nexmark source (known: events_per_batch, max_events, event_gap_us, start_ms)"),
                    ))
                }
            }
        }
        Ok(o)
    }
}

impl SourceProvider for NexmarkSourceProvider {
    fn scheme(&self) -> &'static str {
        "nexmark"
    }

    fn description(&self) -> &'static str {
        "Deterministic Nexmark generator: nexmark://persons|auctions|bids"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        NexmarkOptions::from_uri(uri)?;
        Ok(SourceCapabilities {
            bounded: false,
            unbounded: true,
            guarantee: SourceGuarantee::Replayable,
        })
    }

    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        Ok(Box::new(NexmarkSource::new(ctx)?))
    }
}

/// splitmix64: a well-mixed hash of an event number.
fn mix(n: u64, salt: u64) -> u64 {
    let mut z = n
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(salt.wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

const CITIES: &[&str] = &[
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const NAMES: &[&str] = &[
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];

/// The columns of each stream: (name, natural type).
fn columns(stream: Stream) -> &'static [(&'static str, Kind)] {
    match stream {
        Stream::Persons => &[
            ("id", Kind::Int),
            ("name", Kind::Str),
            ("city", Kind::Str),
            ("date_time", Kind::Time),
        ],
        Stream::Auctions => &[
            ("id", Kind::Int),
            ("seller", Kind::Int),
            ("category", Kind::Int),
            ("initial_bid", Kind::Int),
            ("date_time", Kind::Time),
            ("expires", Kind::Time),
        ],
        Stream::Bids => &[
            ("auction", Kind::Int),
            ("bidder", Kind::Int),
            ("price", Kind::Int),
            ("date_time", Kind::Time),
        ],
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int,
    Str,
    Time,
}

/// A `nexmark://` source.
#[derive(Debug)]
pub struct NexmarkSource {
    schema: SchemaRef,
    options: NexmarkOptions,
    /// Per schema field: the stream column it takes.
    fields: Vec<(&'static str, Kind)>,
}

impl NexmarkSource {
    /// Creates the source, checking that the contract's columns are columns of the
    /// stream with compatible types.
    pub fn new(ctx: SourceContext) -> Result<Self> {
        let options = NexmarkOptions::from_uri(&ctx.uri)?;
        let available = columns(options.stream);
        let mut fields = Vec::new();
        for f in ctx.schema.fields() {
            let col = available.iter().find(|(n, _)| n == f.name());
            let ok = match (col, f.data_type()) {
                (Some((_, Kind::Int)), t) => t.is_integer(),
                (Some((_, Kind::Str)), t) => {
                    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
                }
                (Some((_, Kind::Time)), t) => matches!(t, DataType::Timestamp(..)),
                (None, _) => false,
            };
            if !ok {
                return Err(Error::new(
                    &codes::PORT_TYPE_MISMATCH,
                    format!(
                        "asset `{}`: the Nexmark {:?} stream has the columns {:?}; the contract has `{}` ({})",
                        ctx.asset,
                        options.stream,
                        available.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
                        f.name(),
                        f.data_type()
                    ),
                ));
            }
            fields.push(*col.expect("checked"));
        }
        Ok(NexmarkSource {
            schema: ctx.schema,
            options,
            fields,
        })
    }

    /// Whether global event `n` belongs to this stream.
    fn is_ours(&self, n: u64) -> bool {
        let o = n % EPOCH;
        match self.options.stream {
            Stream::Persons => o == 0,
            Stream::Auctions => (1..=3).contains(&o),
            Stream::Bids => o >= 4,
        }
    }

    fn time_us(&self, n: u64) -> i64 {
        self.options.start_ms * 1000 + n as i64 * self.options.event_gap_us
    }

    /// The value of column `name` of event `n` (which is of this stream).
    fn int(&self, name: &str, n: u64) -> i64 {
        let epoch = n / EPOCH;
        let o = n % EPOCH;
        let persons_so_far = epoch + 1;
        match (self.options.stream, name) {
            (Stream::Persons, "id") => epoch as i64,
            (Stream::Auctions, "id") => (epoch * 3 + o - 1) as i64,
            (Stream::Auctions, "seller") => (mix(n, 1) % persons_so_far) as i64,
            (Stream::Auctions, "category") => (mix(n, 2) % 10) as i64,
            (Stream::Auctions, "initial_bid") => (100 + mix(n, 3) % 10_000) as i64,
            (Stream::Bids, "auction") => {
                let newest = epoch * 3 + 2;
                newest.saturating_sub(mix(n, 4) % HOT_AUCTIONS) as i64
            }
            (Stream::Bids, "bidder") => (mix(n, 5) % persons_so_far) as i64,
            (Stream::Bids, "price") => (100 + mix(n, 6) % 100_000) as i64,
            _ => 0,
        }
    }

    fn batch(&self, events: &[u64]) -> Result<RecordBatch> {
        let engine = |e: arrow::error::ArrowError| Error::new(&codes::ENGINE_ERROR, e.to_string());
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(self.fields.len());
        for ((name, kind), f) in self.fields.iter().zip(self.schema.fields()) {
            let a: ArrayRef = match kind {
                Kind::Int => Arc::new(Int64Array::from_iter_values(
                    events.iter().map(|n| self.int(name, *n)),
                )),
                Kind::Str => {
                    Arc::new(StringArray::from_iter_values(events.iter().map(
                        |n| match *name {
                            "name" => NAMES[(mix(*n, 7) % NAMES.len() as u64) as usize],
                            _ => CITIES[(mix(*n, 8) % CITIES.len() as u64) as usize],
                        },
                    )))
                }
                Kind::Time => {
                    let us = events.iter().map(|n| {
                        let t = self.time_us(*n);
                        if *name == "expires" {
                            t + 10_000_000 + (mix(*n, 9) % 10_000_000) as i64
                        } else {
                            t
                        }
                    });
                    let a = arrow::array::TimestampMicrosecondArray::from_iter_values(us)
                        .with_timezone("UTC");
                    Arc::new(a)
                }
            };
            let a = if a.data_type() == f.data_type() {
                a
            } else {
                cast(&a, f.data_type()).map_err(engine)?
            };
            arrays.push(a);
        }
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some(events.len())),
        )
        .map_err(engine)
    }
}

fn parse(offset: &Offset) -> Result<u64> {
    offset.0.as_u64().ok_or_else(|| {
        Error::new(
            &codes::CHECKPOINT_CORRUPT,
            format!("`{}` is not an offset of a Nexmark source", offset.0),
        )
    })
}

#[async_trait::async_trait]
impl Source for NexmarkSource {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        let from = start.map(parse).transpose()?.unwrap_or(0);
        let mut n = self.options.events_per_batch;
        if let Some(m) = limit.max_records {
            n = n.min(m.max(1));
        }
        let mut end = from.saturating_add(n);
        if let Some(max) = self.options.max_events {
            end = end.min(max);
        }
        if end <= from {
            return Ok(start.cloned());
        }
        Ok(Some(Offset(serde_json::json!(end))))
    }

    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch> {
        let from = start.map(parse).transpose()?.unwrap_or(0);
        let to = parse(end)?;
        let mut out = SourceBatch::default();
        let mut chunk_start = from;
        while chunk_start < to {
            let chunk_end = (chunk_start + CHUNK_EVENTS).min(to);
            let events: Vec<u64> = (chunk_start..chunk_end)
                .filter(|n| self.is_ours(*n))
                .collect();
            if !events.is_empty() {
                out.batches.push(self.batch(&events)?);
            }
            chunk_start = chunk_end;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, Schema, TimeUnit};
    use etlantic_core::streaming::ExecutionMode;

    fn source(uri: &str, cols: &[(&str, DataType)]) -> Result<NexmarkSource> {
        let schema = Arc::new(Schema::new(
            cols.iter()
                .map(|(n, t)| Field::new(*n, t.clone(), true))
                .collect::<Vec<_>>(),
        ));
        NexmarkSource::new(SourceContext {
            asset: "a".into(),
            uri: BindingUri::parse(uri).unwrap(),
            schema,
            contract: None,
            root: ".".into(),
            mode: ExecutionMode::Streaming,
            state_dir: None,
        })
    }

    fn ts() -> DataType {
        DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
    }

    #[tokio::test]
    async fn streams_share_one_event_sequence_and_replay() {
        let mut auctions = source(
            "nexmark://auctions?events_per_batch=100&start_ms=0",
            &[("id", DataType::Int64), ("date_time", ts())],
        )
        .unwrap();
        let mut bids = source(
            "nexmark://bids?events_per_batch=100&start_ms=0",
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
        // Events 1-3 and 51-53 are auctions 0..6, at 100 µs per event.
        assert_eq!(a.num_rows(), 6);
        let ids = a.batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(ids.values(), &[0, 1, 2, 3, 4, 5]);
        let b = bids.read(None, &end).await.unwrap();
        assert_eq!(b.num_rows(), 92);
        assert_eq!(b.batches[0].column(2).data_type(), &DataType::Int32);
        // Bids go to auctions that exist already.
        let auc = b.batches[0]
            .column(0)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert!(auc.values()[..46].iter().all(|x| (0..=2).contains(x)));
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

    #[test]
    fn bad_bindings_and_columns_are_refused() {
        assert!(source("nexmark://trades", &[]).is_err());
        assert!(source("nexmark://bids?speed=3", &[]).is_err());
        let e = source("nexmark://bids", &[("seller", DataType::Int64)]).unwrap_err();
        assert_eq!(e.code(), "ETL301");
    }
}

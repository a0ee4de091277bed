//! The `kafka://` source: topics of a Kafka cluster, read through librdkafka (`rdkafka`).
//!
//! # Binding
//!
//! `kafka://<bootstrap servers>/<topic>[,<topic>...]?startingOffsets=earliest|latest|<json>&maxOffsetsPerTrigger=N&format=json|raw&partitions=0,1&readTimeoutMs=30000&failOnDataLoss=true|false&kafka.<librdkafka property>=<value>`
//!
//! - `<bootstrap servers>` is librdkafka's `bootstrap.servers` (`host:port[,host:port]`),
//!   `<topic>` one topic or a comma-separated list. A listed topic that does not exist
//!   yet has no partitions until it is created (its partitions are then discovered).
//! - `startingOffsets` (Spark's option): `earliest` (default), `latest`, or JSON
//!   `{"topic":{"0":42,"1":-2}}` with the offset of the first record to read per
//!   partition (`-2` earliest, `-1` latest); partitions it does not name start at
//!   earliest. It only matters for a new query: a restarted query goes on from its
//!   checkpoint.
//! - `maxOffsetsPerTrigger` (also `max_offsets_per_trigger`): at most this many offsets
//!   per micro-batch in total; the runtime's [`ReadLimit::max_records`] applies as well
//!   (the smaller wins). The budget is split over the partitions with unread records in
//!   proportion to their backlogs, as Spark does (see [`proportional_split`]), so that
//!   a skewed topic's partitions advance in event time together.
//! - `format`: `raw` (default) or `json` (see Columns).
//! - `partitions`: only read these partition numbers (of every topic).
//! - `readTimeoutMs`: how long a read may wait for the records of its range (default
//!   30000); a read that cannot get them fails with `ETL706` instead of hanging.
//! - `failOnDataLoss` (Spark's option, default `true`; also `fail_on_data_loss`): what a
//!   read does when records of its range are gone from the partition (see Data loss).
//! - `kafka.<property>`: passed to librdkafka as is (e.g. `kafka.security.protocol=SSL`).
//!
//! # Columns
//!
//! The source produces exactly the asset's contract schema. With `format=raw` the
//! contract names Spark's Kafka columns, each optional: `key`, `value` (text, or
//! binary, of UTF-8 content), `topic` (text), `partition` (integer), `offset` (integer),
//! `timestamp` (timestamp, from the record's create or log-append time) and `headers`
//! (text: a JSON array `[{"key":"h","value":"v"}]`, or a list of structs with `key` and
//! `value`). With `format=json` every record's value is a JSON object decoded against
//! the contract like a JSON-lines file ([`crate::decode`]); the metadata is available
//! under the names `kafka_key`, `kafka_topic`, `kafka_partition`, `kafka_offset`,
//! `kafka_timestamp` and `kafka_headers` when the contract declares them (prefixed so
//! that they never collide with fields of the value).
//!
//! A record that does not decode (not UTF-8, not JSON, not an object, wrong types,
//! broken rules, a null value in `json` format) is returned as a
//! [`etlantic_core::data::RejectedRecord`] whose position carries the asset, topic,
//! partition and offset, with the value as raw text; the other records go on.
//!
//! # Offsets and replay
//!
//! Offsets are kept in the query's checkpoint, never in Kafka: the consumer uses
//! `assign()` (no group membership, no subscription) with `enable.auto.commit=false`, so
//! nothing is committed to a consumer group. An offset is Spark's JSON map from topic to
//! partition to the offset of the next record to read, e.g. `{"clicks":{"0":42,"1":17}}`;
//! a batch `(start, end]` reads, per partition, the records with `start <= offset < end`.
//!
//! [`Source::latest_offset`] fetches the topics' metadata at every call, so partitions
//! that appear (a new partition, a listed topic created later) are discovered at the next
//! micro-batch and read from their earliest offset; it then asks each partition's high
//! watermark and applies the read limit. The starting positions of a new query
//! (`earliest`/`latest`/JSON resolved to numbers) are written once to the source's
//! checkpoint directory (`initial-offsets.json`, like Spark's `sources/<n>/0`), so that a
//! replay of the first batch after a crash reads the same range.
//!
//! The consumer keeps its assignment from one read to the next, with a queue of its own
//! per partition: while the runtime processes a micro-batch, librdkafka fetches the
//! partitions' next records (up to `queued.max.messages.kbytes` per partition: 2 MB
//! unless the binding sets `kafka.queued.max.messages.kbytes`; `fetch.queue.backoff.ms`
//! and `fetch.wait.max.ms` are lowered to 20 and 100 ms so that a full queue or a
//! partition at its end does not hold up the others), and a read that starts
//! where the previous one ended finds them waiting. A read that starts anywhere else (a
//! replay, a range after a gap) assigns the partitions anew. A read takes the partitions
//! one after the other, each in offset order, decoding every record as it is polled. The
//! watermarks of all partitions are asked in one request per partition leader, by a
//! second client whose connections no fetch holds up.
//!
//! The source is declared [`SourceGuarantee::Replayable`]: Kafka keeps records by offset,
//! and re-reading `(start, end]` returns the same records (in `(topic, partition, offset)`
//! order), as long as the broker's retention has not deleted them.
//!
//! Bounded (batch) runs read from the starting offsets to the high watermarks found when
//! the run starts.
//!
//! # Data loss
//!
//! Retention deletes a partition's oldest records whether or not a query has read them.
//! Before it reads a range, the source asks each partition for its earliest offset (its
//! low watermark); records of the range below it are lost. By default (as Spark's
//! `failOnDataLoss=true`) the read fails with `ETL712`, naming the topic, the partition
//! and the lost offsets, and nothing past the gap is read; a starting offset given in
//! `startingOffsets` that retention already deleted is a loss too. With
//! `failOnDataLoss=false` the read goes on from the earliest offset still there and
//! returns each gap in [`SourceBatch::lost`]: the runtime records it in the micro-batch's
//! progress (`sources[].dataLoss`) and in the run report. The consumer runs with
//! `auto.offset.reset=error`, so a range deleted between that check and the fetch fails
//! the read instead of jumping silently to another offset (librdkafka's default).
//!
//! The Kafka client calls (metadata, watermarks, polling) are blocking librdkafka calls
//! made from the source's async methods; they are bounded by timeouts.

use crate::decode::{BatchBuilder, ContractDecoder, RecordProblem};
use etlantic_core::data::{DataLoss, Offset, SourcePosition};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, Consumer, DefaultConsumerContext};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::topic_partition_list::{Offset as KOffset, TopicPartitionList};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Per topic, per partition, the offset of the next record to read.
pub type PartitionOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

const META_TIMEOUT: Duration = Duration::from_secs(10);
const INITIAL_FILE: &str = "initial-offsets.json";
/// How many kilobytes librdkafka fetches ahead per partition unless the binding sets
/// `kafka.queued.max.messages.kbytes` (librdkafka's own default, 64 MB, applies per
/// partition once each partition has its own queue, as here).
const READ_AHEAD_KBYTES: &str = "2048";

/// The provider of `kafka://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct KafkaSourceProvider;

inventory::submit! { SourceRegistration(&KafkaSourceProvider) }

/// Where a new query starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartingOffsets {
    /// Every partition's low watermark.
    Earliest,
    /// Every partition's high watermark when the query starts.
    Latest,
    /// Per partition: an offset, `-2` (earliest) or `-1` (latest); others earliest.
    Specific(PartitionOffsets),
}

/// How record values are turned into rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueFormat {
    /// Spark's Kafka columns (`key`, `value`, `topic`, ...).
    Raw,
    /// The value is a JSON object decoded against the contract.
    Json,
}

/// The options of a `kafka://` source binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaSourceOptions {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The topics read.
    pub topics: Vec<String>,
    /// Only these partitions, when given.
    pub partitions: Option<Vec<i32>>,
    /// `startingOffsets`.
    pub starting: StartingOffsets,
    /// `maxOffsetsPerTrigger`.
    pub max_offsets_per_trigger: Option<u64>,
    /// `format`.
    pub format: ValueFormat,
    /// `readTimeoutMs`.
    pub read_timeout: Duration,
    /// `failOnDataLoss`.
    pub fail_on_data_loss: bool,
    /// `kafka.*` properties passed to librdkafka.
    pub client: BTreeMap<String, String>,
}

fn bad_param(uri: &BindingUri, key: &str, value: &str, expected: &str) -> Error {
    Error::new(
        &codes::BAD_URI,
        format!(
            "binding `{}`: parameter `{key}={value}` is invalid, expected {expected}",
            uri.redacted()
        ),
    )
}

/// Splits `<bootstrap>/<topics>` and checks both are present (`ETL007` otherwise).
pub(crate) fn split_location(uri: &BindingUri) -> Result<(String, Vec<String>)> {
    let (servers, topics) = uri.location.split_once('/').unwrap_or((&uri.location, ""));
    let topics: Vec<String> = topics
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(String::from)
        .collect();
    if servers.trim().is_empty() || topics.is_empty() {
        return Err(Error::new(
            &codes::BAD_URI,
            format!(
                "binding `{}`: expected kafka://<host:port[,host:port]>/<topic>[,<topic>]",
                uri.redacted()
            ),
        ));
    }
    Ok((servers.trim().to_string(), topics))
}

impl KafkaSourceOptions {
    /// Parses a `kafka://` source URI. Unknown parameters and bad values are `ETL007`.
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let (bootstrap, topics) = split_location(uri)?;
        let mut o = KafkaSourceOptions {
            bootstrap,
            topics,
            partitions: None,
            starting: StartingOffsets::Earliest,
            max_offsets_per_trigger: None,
            format: ValueFormat::Raw,
            read_timeout: Duration::from_secs(30),
            fail_on_data_loss: true,
            client: BTreeMap::new(),
        };
        for (key, value) in &uri.params {
            match key.as_str() {
                "startingOffsets" | "starting_offsets" => {
                    o.starting = match value.as_str() {
                        "earliest" => StartingOffsets::Earliest,
                        "latest" => StartingOffsets::Latest,
                        json => {
                            StartingOffsets::Specific(serde_json::from_str(json).map_err(|_| {
                                bad_param(
                                    uri,
                                    key,
                                    value,
                                    "`earliest`, `latest` or JSON like {\"topic\":{\"0\":42}}",
                                )
                            })?)
                        }
                    }
                }
                "maxOffsetsPerTrigger" | "max_offsets_per_trigger" => {
                    o.max_offsets_per_trigger = Some(
                        value
                            .parse::<u64>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| bad_param(uri, key, value, "a positive integer"))?,
                    )
                }
                "format" => {
                    o.format = match value.as_str() {
                        "raw" => ValueFormat::Raw,
                        "json" => ValueFormat::Json,
                        _ => return Err(bad_param(uri, key, value, "`raw` or `json`")),
                    }
                }
                "partitions" => {
                    o.partitions = Some(
                        value
                            .split(',')
                            .map(|p| p.trim().parse::<i32>().ok().filter(|p| *p >= 0))
                            .collect::<Option<Vec<_>>>()
                            .ok_or_else(|| {
                                bad_param(uri, key, value, "partition numbers like 0,1,2")
                            })?,
                    )
                }
                "readTimeoutMs" | "read_timeout_ms" => {
                    o.read_timeout = Duration::from_millis(
                        value
                            .parse::<u64>()
                            .ok()
                            .filter(|n| *n > 0)
                            .ok_or_else(|| bad_param(uri, key, value, "milliseconds"))?,
                    )
                }
                "failOnDataLoss" | "fail_on_data_loss" => {
                    o.fail_on_data_loss = match value.to_ascii_lowercase().as_str() {
                        "true" => true,
                        "false" => false,
                        _ => return Err(bad_param(uri, key, value, "`true` or `false`")),
                    }
                }
                k if k.starts_with("kafka.") => {
                    o.client
                        .insert(k["kafka.".len()..].to_string(), value.clone());
                }
                _ => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                        "binding `{}`: unknown parameter `{key}` for the Kafka source (known: {})",
                        uri.redacted(),
                        option_names(OPTIONS)
                    ),
                    ))
                }
            }
        }
        Ok(o)
    }
}

/// The query parameters of a `kafka://` source binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "startingOffsets",
        default: "earliest",
        meaning: "Where a new query starts: `earliest`, `latest`, or JSON such as `{\"topic\":{\"0\":42}}` (-2 earliest, -1 latest); a restarted query resumes from its checkpoint (also `starting_offsets`).",
    },
    BindingOption {
        name: "maxOffsetsPerTrigger",
        default: "unlimited",
        meaning: "At most this many offsets per micro-batch, split over the partitions by backlog; the pipeline's `read_limit.max_records` also applies (also `max_offsets_per_trigger`).",
    },
    BindingOption {
        name: "format",
        default: "raw",
        meaning: "`raw` gives Spark's Kafka columns (`key`, `value`, `topic`, ...); `json` decodes each value as a JSON object against the contract.",
    },
    BindingOption {
        name: "partitions",
        default: "all",
        meaning: "Read only these partitions of every topic, e.g. `0,1`.",
    },
    BindingOption {
        name: "readTimeoutMs",
        default: "30000",
        meaning: "How long a read waits for its records before failing with ETL706 (also `read_timeout_ms`).",
    },
    BindingOption {
        name: "failOnDataLoss",
        default: "true",
        meaning: "Fail with ETL712 when retention deleted records not yet read; `false` skips the gap and reports it (also `fail_on_data_loss`).",
    },
    BindingOption {
        name: "kafka.<property>",
        default: "",
        meaning: "Passed to librdkafka as is (e.g. `kafka.security.protocol=SSL`); it can override the source's own settings.",
    },
];

impl SourceProvider for KafkaSourceProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "kafka"
    }

    fn description(&self) -> &'static str {
        "Kafka topics (offsets in the checkpoint, JSON or raw values)"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        KafkaSourceOptions::from_uri(uri)?;
        Ok(SourceCapabilities {
            bounded: true,
            unbounded: true,
            guarantee: SourceGuarantee::Replayable,
        })
    }

    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        Ok(Box::new(KafkaSource::new(ctx)?))
    }
}

/// `ETL712`: offsets `from..to` of `topic`/`partition` were deleted before they were read.
fn data_lost(asset: &str, topic: &str, partition: i32, from: i64, to: i64) -> Error {
    Error::new(
        &codes::SOURCE_DATA_LOST,
        format!(
            "asset `{asset}`: offsets {from}..{to} of topic `{topic}` partition {partition} are gone (deleted by retention before the query read them)"
        ),
    )
}

/// An `ETL706` error for a failed Kafka call.
pub(crate) fn kafka_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(&codes::IO_ERROR, format!("kafka: cannot {what}: {e}"))
}

/// A record read, owned.
/// A record read, owned; made only for records the fast path does not take.
struct Record {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    offset: i64,
    timestamp: Option<i64>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    fn of(m: &BorrowedMessage<'_>) -> Record {
        Record {
            key: m.key().map(<[u8]>::to_vec),
            value: m.payload().map(<[u8]>::to_vec),
            offset: m.offset(),
            timestamp: m.timestamp().to_millis(),
            headers: m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(<[u8]>::to_vec)))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

/// The consumer's assignment, kept from one read to the next. A micro-batch usually
/// starts where the previous one ended; meanwhile librdkafka goes on fetching each
/// partition's next records (up to `queued.max.messages.kbytes` per partition), so the
/// next read finds them waiting instead of starting new fetches.
struct Assignment {
    parts: BTreeMap<(String, i32), AssignedPartition>,
}

struct AssignedPartition {
    /// The partition's own queue, split off the consumer's, so that a read takes each
    /// partition's records in offset order and leaves later ones in librdkafka.
    queue: PartitionQueue<DefaultConsumerContext>,
    /// Every record below this offset has been polled.
    next: i64,
    /// Records polled but not yet read, in offset order, before anything on `queue`: one
    /// past the end of a range (offsets have gaps), or records fetched before the queue
    /// was split off the consumer's.
    held: std::collections::VecDeque<Record>,
}

/// Decodes the records of one partition's range as they are polled, gathering the good
/// rows' offsets into origin runs.
struct PartitionDecode<'a> {
    source: &'a KafkaSource,
    topic: &'a str,
    partition: i32,
    /// The first offset and length of the current run of consecutive good records.
    run: Option<(i64, u64)>,
}

/// Rows per Arrow batch a read makes.
const BATCH_ROWS: usize = 8192;

impl PartitionDecode<'_> {
    /// A record straight from librdkafka's buffer: the fast path reads the value in place.
    fn borrowed(
        &mut self,
        builder: &mut BatchBuilder,
        out: &mut SourceBatch,
        m: &BorrowedMessage<'_>,
    ) -> Result<()> {
        let fast = self.source.options.format == ValueFormat::Json
            && !self.source.json_metadata
            && m.payload().is_some_and(|v| builder.push_json_bytes(v));
        if fast {
            self.good(m.offset(), out);
            return self.flush_full(builder, out);
        }
        self.owned(builder, out, &Record::of(m))
    }

    fn owned(
        &mut self,
        builder: &mut BatchBuilder,
        out: &mut SourceBatch,
        r: &Record,
    ) -> Result<()> {
        let s = self.source;
        let fast = s.options.format == ValueFormat::Json
            && s.push_fast(builder, self.topic, self.partition, r);
        let problem = if fast {
            None
        } else {
            match s.record_json(self.topic, self.partition, r) {
                Ok(v) => builder.push_json(&v).err(),
                Err(p) => Some(p),
            }
        };
        match problem {
            None => self.good(r.offset, out),
            Some(problem) => {
                let raw = r
                    .value
                    .as_deref()
                    .map(|v| String::from_utf8_lossy(v).into_owned())
                    .unwrap_or_default();
                out.rejected.push(
                    problem.into_rejected(s.position(self.topic, self.partition, r.offset), raw),
                );
            }
        }
        self.flush_full(builder, out)
    }

    fn good(&mut self, offset: i64, out: &mut SourceBatch) {
        match &mut self.run {
            Some((first, n)) if *first + *n as i64 == offset => *n += 1,
            _ => {
                self.close(out);
                self.run = Some((offset, 1));
            }
        }
    }

    fn flush_full(&self, builder: &mut BatchBuilder, out: &mut SourceBatch) -> Result<()> {
        if builder.len() >= BATCH_ROWS {
            out.batches.extend(builder.finish()?);
        }
        Ok(())
    }

    fn close(&mut self, out: &mut SourceBatch) {
        if let Some((first, n)) = self.run.take() {
            out.origins
                .push_run(self.source.position(self.topic, self.partition, first), n);
        }
    }
}

/// A `kafka://` source.
pub struct KafkaSource {
    asset: String,
    options: KafkaSourceOptions,
    decoder: ContractDecoder,
    consumer: Arc<BaseConsumer>,
    /// A second client for metadata and watermarks: on the consumer's own connections
    /// they would wait behind its fetches, which the broker holds up to
    /// `fetch.wait.max.ms` at the end of a partition.
    meta: BaseConsumer,
    /// The partitions assigned to the consumer by the last read that succeeded.
    assignment: Option<Assignment>,
    /// The source's checkpoint directory (`initial-offsets.json`).
    state: Option<std::sync::Arc<dyn etlantic_core::storage::Storage>>,
    initial: Option<PartitionOffsets>,
    /// Whether the contract has a metadata column (`kafka_key`, ...) of the `json`
    /// format: without one, a record's value is all the decoder reads.
    json_metadata: bool,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("asset", &self.asset)
            .field("options", &self.options)
            .finish()
    }
}

fn parse_offset(offset: &Offset) -> Result<PartitionOffsets> {
    serde_json::from_value(offset.0.clone()).map_err(|_| {
        Error::new(
            &codes::CHECKPOINT_CORRUPT,
            format!(
                "`{}` is not a Kafka source offset (expected {{\"topic\":{{\"0\":42}}}})",
                offset.0
            ),
        )
    })
}

fn to_offset(map: &PartitionOffsets) -> Offset {
    Offset(serde_json::to_value(map).unwrap_or(Value::Null))
}

/// Splits a micro-batch's `budget` of offsets over the partitions' backlogs `wants` the
/// way Spark's Kafka source does (`KafkaMicroBatchStream.rateLimit`): in proportion to
/// each backlog, rounded down, except that a partition whose share is below one offset
/// gets one (Spark does not starve small partitions, so the total may exceed the budget by
/// at most the number of such partitions). Proportional shares keep the partitions'
/// event times moving together: an equal split of a skewed topic lets the small
/// partitions run ahead, drag the watermark forward and make the big ones' rows late.
pub fn proportional_split(wants: &[u64], budget: u64) -> Vec<u64> {
    let total: u64 = wants.iter().sum();
    if total <= budget {
        return wants.to_vec();
    }
    wants
        .iter()
        .map(|&want| {
            if want == 0 {
                return 0;
            }
            let share = budget as f64 * (want as f64 / total as f64);
            let share = if share < 1.0 {
                share.ceil()
            } else {
                share.floor()
            };
            (share as u64).min(want)
        })
        .collect()
}

impl KafkaSource {
    /// Creates the source: parses the binding and creates the consumer (no I/O yet).
    pub fn new(ctx: SourceContext) -> Result<Self> {
        let options = KafkaSourceOptions::from_uri(&ctx.uri)?;
        let decoder = ContractDecoder::new(ctx.schema.clone(), ctx.contract.as_deref())?;
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", &options.bootstrap)
            .set("group.id", format!("etlantic-{}", ctx.asset))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "false")
            .set("allow.auto.create.topics", "false")
            .set("isolation.level", "read_committed")
            // An assigned offset that no longer exists is an error, never a silent jump
            // to the end of the partition (see Data loss).
            .set("auto.offset.reset", "error")
            .set("queued.max.messages.kbytes", READ_AHEAD_KBYTES)
            // A partition whose queue is full is left out of fetches for this long, and
            // a fetch of partitions at their end is held by the broker up to
            // `fetch.wait.max.ms` while a partition that is read waits behind it
            // (librdkafka has one fetch in flight per broker): librdkafka's defaults
            // (1 s, 500 ms) would stall a read of a backlog for that long.
            .set("fetch.queue.backoff.ms", "20")
            .set("fetch.wait.max.ms", "100");
        for (k, v) in &options.client {
            config.set(k, v);
        }
        let consumer: Arc<BaseConsumer> = Arc::new(
            config
                .create()
                .map_err(|e| kafka_error("create a consumer", e))?,
        );
        let meta: BaseConsumer = config
            .create()
            .map_err(|e| kafka_error("create a consumer", e))?;
        let state = ctx.state_dir.as_deref().map(etlantic_core::storage::open);
        // An unreadable file is an error, not a new query: its starting offsets would be
        // resolved again, and a replay of the first batch could read another range.
        let initial = match &state {
            Some(st) => match st.read(INITIAL_FILE)? {
                Some(bytes) => Some(serde_json::from_slice(&bytes).map_err(|e| {
                    Error::new(
                        &codes::CHECKPOINT_CORRUPT,
                        format!("{}: {e}", st.display(INITIAL_FILE)),
                    )
                })?),
                None => None,
            },
            None => None,
        };
        let json_metadata = METADATA_COLUMNS
            .iter()
            .any(|c| decoder.column_index(&format!("kafka_{c}")).is_some());
        Ok(KafkaSource {
            asset: ctx.asset,
            options,
            decoder,
            consumer,
            meta,
            assignment: None,
            state,
            initial,
            json_metadata,
        })
    }

    /// The partitions of the topics now (metadata fetch), in `(topic, partition)` order.
    fn partitions(&self) -> Result<Vec<(String, i32)>> {
        let mut out = Vec::new();
        for topic in &self.options.topics {
            let md = self
                .meta
                .fetch_metadata(Some(topic), META_TIMEOUT)
                .map_err(|e| kafka_error(&format!("fetch the metadata of `{topic}`"), e))?;
            for t in md.topics() {
                if t.name() != topic || t.error().is_some() {
                    continue; // unknown topic: no partitions yet
                }
                let mut ps: Vec<i32> = t
                    .partitions()
                    .iter()
                    .map(|p| p.id())
                    .filter(|p| {
                        self.options
                            .partitions
                            .as_ref()
                            .is_none_or(|l| l.contains(p))
                    })
                    .collect();
                ps.sort_unstable();
                out.extend(ps.into_iter().map(|p| (topic.clone(), p)));
            }
        }
        Ok(out)
    }

    fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64)> {
        self.meta
            .fetch_watermarks(topic, partition, META_TIMEOUT)
            .map_err(|e| kafka_error(&format!("fetch the watermarks of {topic}/{partition}"), e))
    }

    /// The low (`KOffset::Beginning`) or high (`KOffset::End`) watermarks of `parts`, in
    /// one request per partition leader rather than one round trip per partition (the
    /// same `ListOffsets` request, with the consumer's isolation level).
    fn edge_offsets(
        &self,
        parts: &[(String, i32)],
        edge: KOffset,
    ) -> Result<BTreeMap<(String, i32), i64>> {
        let mut out = BTreeMap::new();
        if parts.is_empty() {
            return Ok(out);
        }
        let mut tpl = TopicPartitionList::new();
        for (t, p) in parts {
            tpl.add_partition_offset(t, *p, edge)
                .map_err(|e| kafka_error("build the offsets request", e))?;
        }
        let which = if edge == KOffset::End { "high" } else { "low" };
        let answered = self
            .meta
            .offsets_for_times(tpl, META_TIMEOUT)
            .map_err(|e| kafka_error(&format!("fetch the {which} watermarks"), e))?;
        for e in answered.elements() {
            let (t, p) = (e.topic(), e.partition());
            match (e.error(), e.offset()) {
                (Ok(()), KOffset::Offset(o)) => {
                    out.insert((t.to_string(), p), o);
                }
                (Err(err), _) => {
                    return Err(kafka_error(
                        &format!("fetch the {which} watermark of {t}/{p}"),
                        err,
                    ))
                }
                (Ok(()), other) => {
                    return Err(kafka_error(
                        &format!("fetch the {which} watermark of {t}/{p}"),
                        format!("the broker answered {other:?}"),
                    ))
                }
            }
        }
        for (t, p) in parts {
            if !out.contains_key(&(t.clone(), *p)) {
                return Err(kafka_error(
                    &format!("fetch the {which} watermark of {t}/{p}"),
                    "the broker did not answer for it",
                ));
            }
        }
        Ok(out)
    }

    /// The starting positions of a new query, resolved once and persisted.
    fn initial(&mut self, parts: &[(String, i32)]) -> Result<PartitionOffsets> {
        if let Some(i) = &self.initial {
            return Ok(i.clone());
        }
        let mut map = PartitionOffsets::new();
        for (t, p) in parts {
            let wanted = match &self.options.starting {
                StartingOffsets::Earliest => -2,
                StartingOffsets::Latest => -1,
                StartingOffsets::Specific(m) => {
                    m.get(t).and_then(|ps| ps.get(p)).copied().unwrap_or(-2)
                }
            };
            let (lo, hi) = self.watermarks(t, *p)?;
            let pos = match wanted {
                -2 => lo,
                -1 => hi,
                // Below the earliest offset: kept, so that the first read reports the
                // records retention took as lost (see Data loss).
                n => n.clamp(0, hi),
            };
            map.entry(t.clone()).or_default().insert(*p, pos);
        }
        if let Some(state) = &self.state {
            etlantic_core::storage::put_bytes(
                state.as_ref(),
                INITIAL_FILE,
                &serde_json::to_vec(&map).unwrap_or_default(),
            )?;
        }
        self.initial = Some(map.clone());
        Ok(map)
    }

    /// Where each partition starts after `start` (a partition it lacks: the initial
    /// position, or the earliest offset for partitions discovered later).
    fn begin(
        &mut self,
        start: Option<&Offset>,
        parts: &[(String, i32)],
    ) -> Result<PartitionOffsets> {
        let mut begin = match start {
            Some(o) => parse_offset(o)?,
            None => self.initial(parts)?,
        };
        for (t, p) in parts {
            if begin.get(t).and_then(|m| m.get(p)).is_none() {
                let (lo, _) = self.watermarks(t, *p)?;
                begin.entry(t.clone()).or_default().insert(*p, lo);
            }
        }
        Ok(begin)
    }

    fn position(&self, topic: &str, partition: i32, offset: i64) -> SourcePosition {
        SourcePosition {
            asset: self.asset.clone(),
            topic: Some(topic.to_string()),
            partition: Some(partition),
            offset: Some(offset),
            ..SourcePosition::default()
        }
    }

    fn field_type(&self, name: &str) -> Option<arrow::datatypes::DataType> {
        self.decoder
            .schema()
            .field_with_name(name)
            .ok()
            .map(|f| f.data_type().clone())
    }

    /// The JSON object fed to the decoder for one record.
    fn record_json(
        &self,
        topic: &str,
        partition: i32,
        r: &Record,
    ) -> std::result::Result<Value, RecordProblem> {
        let (mut obj, prefix) = match self.options.format {
            ValueFormat::Raw => {
                let mut m = Map::new();
                m.insert("value".into(), utf8_value(&r.value, "value")?);
                (m, "")
            }
            ValueFormat::Json => {
                let Some(v) = &r.value else {
                    return Err(RecordProblem::unparsable("the value is null (a tombstone)"));
                };
                let s = std::str::from_utf8(v)
                    .map_err(|_| RecordProblem::unparsable("the value is not UTF-8"))?;
                match serde_json::from_str::<Value>(s) {
                    Ok(Value::Object(m)) => (m, "kafka_"),
                    Ok(other) => {
                        return Err(RecordProblem::unparsable(format!(
                            "the value is not a JSON object but {}",
                            match other {
                                Value::Array(_) => "an array",
                                Value::String(_) => "a string",
                                Value::Number(_) => "a number",
                                Value::Bool(_) => "a boolean",
                                _ => "null",
                            }
                        )))
                    }
                    Err(e) => {
                        return Err(RecordProblem::unparsable(format!(
                            "the value is not JSON: {e}"
                        )))
                    }
                }
            }
        };
        obj.extend(self.metadata(topic, partition, r, prefix)?);
        Ok(Value::Object(obj))
    }

    /// The record's metadata columns the contract has (`{prefix}key`, `topic`, ...), as
    /// the JSON values the decoder reads.
    fn metadata(
        &self,
        topic: &str,
        partition: i32,
        r: &Record,
        prefix: &str,
    ) -> std::result::Result<Vec<(String, Value)>, RecordProblem> {
        let mut meta = Vec::new();
        let name = |c: &str| format!("{prefix}{c}");
        let wants = |c: &str| self.field_type(&name(c));
        if wants("key").is_some() {
            meta.push((name("key"), utf8_value(&r.key, "key")?));
        }
        if wants("topic").is_some() {
            meta.push((name("topic"), json!(topic)));
        }
        if wants("partition").is_some() {
            meta.push((name("partition"), json!(partition)));
        }
        if wants("offset").is_some() {
            meta.push((name("offset"), json!(r.offset)));
        }
        if wants("timestamp").is_some() {
            meta.push((
                name("timestamp"),
                r.timestamp.map_or(Value::Null, |t| json!(t)),
            ));
        }
        if let Some(dt) = wants("headers") {
            let mut hs = Vec::with_capacity(r.headers.len());
            for (k, v) in &r.headers {
                hs.push(json!({"key": k, "value": utf8_value(v, "header value")?}));
            }
            let hs = Value::Array(hs);
            let v = match dt {
                arrow::datatypes::DataType::Utf8 | arrow::datatypes::DataType::LargeUtf8 => {
                    Value::String(hs.to_string())
                }
                _ => hs,
            };
            meta.push((name("headers"), v));
        }
        Ok(meta)
    }

    /// Decodes a JSON-format record through the decoder's fast path; `false` when it
    /// needs the per-record path ([`KafkaSource::record_json`]), nothing added.
    fn push_fast(
        &self,
        builder: &mut BatchBuilder,
        topic: &str,
        partition: i32,
        r: &Record,
    ) -> bool {
        let Some(bytes) = r.value.as_deref() else {
            return false;
        };
        if !self.json_metadata {
            return builder.push_json_bytes(bytes);
        }
        let Ok(meta) = self.metadata(topic, partition, r, "kafka_") else {
            return false;
        };
        let mut given = Vec::with_capacity(meta.len());
        for (name, value) in meta {
            match self.decoder.column_index(&name) {
                Some(c) => given.push((c, value)),
                None => return false,
            }
        }
        builder.push_json_bytes_with(bytes, &given)
    }

    /// Assigns the partitions of `ranges` at their beginnings, each with its own queue.
    fn assign(&self, ranges: &BTreeMap<(String, i32), (i64, i64)>) -> Result<Assignment> {
        let mut tpl = TopicPartitionList::new();
        for ((t, p), (b, _)) in ranges {
            tpl.add_partition_offset(t, *p, KOffset::Offset(*b))
                .map_err(|e| kafka_error("build the assignment", e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| kafka_error("assign partitions", e))?;
        let mut parts = BTreeMap::new();
        for ((t, p), (b, _)) in ranges {
            let queue = self.consumer.split_partition_queue(t, *p).ok_or_else(|| {
                kafka_error(
                    &format!("give {t}/{p} its own queue"),
                    "librdkafka does not know the partition",
                )
            })?;
            let part = AssignedPartition {
                queue,
                next: *b,
                held: std::collections::VecDeque::new(),
            };
            parts.insert((t.clone(), *p), part);
        }
        // Records fetched before a partition's queue was split off went to the consumer's
        // queue: they come before anything on the partition's own queue.
        while let Some(polled) = self.consumer.poll(Duration::ZERO) {
            let m = polled.map_err(|e| kafka_error("read records", e))?;
            if let Some(part) = parts.get_mut(&(m.topic().to_string(), m.partition())) {
                part.held.push_back(Record::of(&m));
            }
        }
        Ok(Assignment { parts })
    }

    /// Reads `ranges` (per partition `[begin, end)`; every partition of the read, empty
    /// ranges included, so that the assignment can serve the next read too) and decodes
    /// the records as they are polled, partition by partition in offset order.
    fn read_ranges(&mut self, ranges: &BTreeMap<(String, i32), (i64, i64)>) -> Result<SourceBatch> {
        let kept = self.assignment.take().filter(|a| {
            a.parts.len() == ranges.len()
                && ranges
                    .iter()
                    .all(|(k, (b, _))| a.parts.get(k).is_some_and(|part| part.next == *b))
        });
        let reused = kept.is_some();
        let mut assignment = match kept {
            Some(a) => a,
            None => self.assign(ranges)?,
        };
        let mut decoded = SourceBatch::default();
        match self.poll_ranges(ranges, &mut assignment, &mut decoded) {
            Ok(()) => {
                self.assignment = Some(assignment);
                Ok(decoded)
            }
            // A kept assignment can hold an error a partition met while reading ahead
            // (say, offsets deleted since): the read is made again from a new assignment,
            // which reports what is still wrong.
            Err(_) if reused => {
                drop(assignment);
                self.read_ranges(ranges)
            }
            Err(e) => Err(e),
        }
    }

    fn poll_ranges(
        &self,
        ranges: &BTreeMap<(String, i32), (i64, i64)>,
        assignment: &mut Assignment,
        out: &mut SourceBatch,
    ) -> Result<()> {
        let deadline = Instant::now() + self.options.read_timeout;
        let mut builder: BatchBuilder = self.decoder.builder();
        for ((topic, partition), &(b, e)) in ranges {
            if e <= b {
                continue;
            }
            let part = assignment
                .parts
                .get_mut(&(topic.clone(), *partition))
                .expect("every partition of the read is assigned");
            let mut decode = PartitionDecode {
                source: self,
                topic,
                partition: *partition,
                run: None,
            };
            // Good records with consecutive offsets make one origin run.
            let done = loop {
                let Some(r) = part.held.front() else {
                    break false;
                };
                if r.offset >= e {
                    break true;
                }
                let r = part.held.pop_front().expect("a front");
                if r.offset >= b {
                    decode.owned(&mut builder, out, &r)?;
                }
                if r.offset + 1 >= e {
                    break true;
                }
            };
            // Then the partition's own queue, up to the end of the range.
            if !done {
                loop {
                    match part.queue.poll(Duration::from_millis(100)) {
                        Some(Ok(m)) => {
                            let off = m.offset();
                            if off >= e {
                                part.held.push_back(Record::of(&m));
                                break;
                            }
                            if off >= b {
                                decode.borrowed(&mut builder, out, &m)?;
                            }
                            if off + 1 >= e {
                                break;
                            }
                        }
                        Some(Err(KafkaError::MessageConsumption(
                            rdkafka::types::RDKafkaErrorCode::AutoOffsetReset,
                        ))) => {
                            // Deleted between the low-watermark check and the fetch: the next
                            // read of the range finds the gap and reports it (see Data loss).
                            return Err(data_lost(&self.asset, topic, *partition, b, e));
                        }
                        Some(Err(KafkaError::PartitionEOF(_))) | None => {
                            match self.consumer.poll(Duration::ZERO) {
                                Some(Err(err)) => return Err(kafka_error("read records", err)),
                                Some(Ok(m)) => {
                                    return Err(kafka_error(
                                        "read records",
                                        format!(
                                            "a record of {}/{} arrived on the consumer's queue after its partition had its own",
                                            m.topic(),
                                            m.partition()
                                        ),
                                    ))
                                }
                                None => {}
                            }
                            // Offsets may have gaps (transaction markers, compaction): a
                            // partition whose consumer position passed the end is done.
                            if self.position_of(topic, *partition) >= e {
                                break;
                            }
                        }
                        Some(Err(err)) => return Err(kafka_error("read records", err)),
                    }
                    if Instant::now() > deadline {
                        return Err(Error::new(
                            &codes::IO_ERROR,
                            format!(
                                "kafka: reading offsets {b}..{e} of {topic}/{partition} did not complete within {:?} (records deleted by retention, or the broker is unreachable)",
                                self.options.read_timeout
                            ),
                        ));
                    }
                }
            }
            part.next = e;
            decode.close(out);
        }
        out.batches.extend(builder.finish()?);
        Ok(())
    }

    /// The consumer's position in a partition (the offset after the last record it
    /// returned, past any gap), or -1 when it has none.
    fn position_of(&self, topic: &str, partition: i32) -> i64 {
        let Ok(pos) = self.consumer.position() else {
            return -1;
        };
        pos.elements()
            .iter()
            .find(|e| e.topic() == topic && e.partition() == partition)
            .and_then(|e| match e.offset() {
                KOffset::Offset(o) => Some(o),
                _ => None,
            })
            .unwrap_or(-1)
    }
}

#[async_trait::async_trait]
impl Source for KafkaSource {
    fn checks_record_rules(&self) -> bool {
        // The contract decoder checks them while it decodes, with each record's position.
        true
    }

    fn schema(&self) -> arrow::datatypes::SchemaRef {
        self.decoder.schema()
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        let parts = self.partitions()?;
        let begin = self.begin(start, &parts)?;
        let highs = self.edge_offsets(&parts, KOffset::End)?;
        let mut keys = Vec::new();
        let mut wants = Vec::new();
        for (t, ps) in &begin {
            for (p, b) in ps {
                // A partition no longer listed keeps its position.
                let hi = highs.get(&(t.clone(), *p)).copied().unwrap_or(*b);
                keys.push((t.clone(), *p, *b));
                wants.push(hi.saturating_sub(*b).max(0) as u64);
            }
        }
        let budget = match (self.options.max_offsets_per_trigger, limit.max_records) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let give = match budget {
            Some(n) => proportional_split(&wants, n),
            None => wants.clone(),
        };
        if give.iter().all(|g| *g == 0) {
            return Ok(start.cloned());
        }
        let mut end = PartitionOffsets::new();
        for ((t, p, b), g) in keys.into_iter().zip(give) {
            end.entry(t).or_default().insert(p, b + g as i64);
        }
        Ok(Some(to_offset(&end)))
    }

    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch> {
        let end = parse_offset(end)?;
        let parts: Vec<(String, i32)> = end
            .iter()
            .flat_map(|(t, ps)| ps.keys().map(move |p| (t.clone(), *p)))
            .collect();
        let begin = self.begin(start, &parts)?;
        let mut ranges = BTreeMap::new();
        let mut out = SourceBatch::default();
        let reading: Vec<(String, i32)> = parts
            .iter()
            .filter(|(t, p)| end[t][p] > begin[t][p])
            .cloned()
            .collect();
        let lows = self.edge_offsets(&reading, KOffset::Beginning)?;
        for (t, p) in &parts {
            let mut b = begin[t][p];
            let e = end[t][p];
            if let Some(&lo) = lows.get(&(t.clone(), *p)) {
                if lo > b {
                    let gone = lo.min(e);
                    if self.options.fail_on_data_loss {
                        return Err(data_lost(&self.asset, t, *p, b, gone));
                    }
                    out.lost.push(DataLoss {
                        from: self.position(t, *p, b),
                        records: Some((gone - b) as u64),
                        reason: format!(
                            "offsets {b}..{gone} of {t}/{p} were deleted (retention) before the query read them; going on from {gone} (failOnDataLoss=false)"
                        ),
                    });
                    b = gone;
                }
            }
            ranges.insert((t.clone(), *p), (b, e));
        }
        let decoded = self.read_ranges(&ranges)?;
        Ok(SourceBatch {
            lost: out.lost,
            ..decoded
        })
    }

    fn describe_offset(&self, offset: &Offset) -> Value {
        offset.0.clone()
    }
}
/// The metadata columns a record can give, as named in the `raw` format (the `json`
/// format prefixes them with `kafka_`).
const METADATA_COLUMNS: [&str; 6] = [
    "key",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "headers",
];

/// An optional byte string as a JSON string (null when absent); `what` names it in the
/// problem when it is not UTF-8.
fn utf8_value(b: &Option<Vec<u8>>, what: &str) -> std::result::Result<Value, RecordProblem> {
    match b {
        None => Ok(Value::Null),
        Some(b) => std::str::from_utf8(b)
            .map(|s| Value::String(s.to_string()))
            .map_err(|_| RecordProblem::unparsable(format!("the {what} is not UTF-8"))),
    }
}

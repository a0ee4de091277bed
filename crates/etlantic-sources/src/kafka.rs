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
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Headers, Message};
use rdkafka::topic_partition_list::{Offset as KOffset, TopicPartitionList};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Per topic, per partition, the offset of the next record to read.
pub type PartitionOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

const META_TIMEOUT: Duration = Duration::from_secs(10);
const INITIAL_FILE: &str = "initial-offsets.json";

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
struct Record {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    offset: i64,
    timestamp: Option<i64>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

/// A `kafka://` source.
pub struct KafkaSource {
    asset: String,
    options: KafkaSourceOptions,
    decoder: ContractDecoder,
    consumer: BaseConsumer,
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
            .set("auto.offset.reset", "error");
        for (k, v) in &options.client {
            config.set(k, v);
        }
        let consumer: BaseConsumer = config
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
                .consumer
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
        self.consumer
            .fetch_watermarks(topic, partition, META_TIMEOUT)
            .map_err(|e| kafka_error(&format!("fetch the watermarks of {topic}/{partition}"), e))
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

    /// Polls the records of `ranges` (per partition `[begin, end)`).
    fn fetch(
        &self,
        ranges: &BTreeMap<(String, i32), (i64, i64)>,
    ) -> Result<BTreeMap<(String, i32), Vec<Record>>> {
        let mut out: BTreeMap<(String, i32), Vec<Record>> = BTreeMap::new();
        let mut pending: BTreeMap<(String, i32), (i64, i64)> = ranges
            .iter()
            .filter(|(_, (b, e))| e > b)
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        if pending.is_empty() {
            return Ok(out);
        }
        let mut tpl = TopicPartitionList::new();
        for ((t, p), (b, _)) in &pending {
            tpl.add_partition_offset(t, *p, KOffset::Offset(*b))
                .map_err(|e| kafka_error("build the assignment", e))?;
        }
        self.consumer
            .assign(&tpl)
            .map_err(|e| kafka_error("assign partitions", e))?;
        let deadline = Instant::now() + self.options.read_timeout;
        while !pending.is_empty() {
            match self.consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let key = (m.topic().to_string(), m.partition());
                    if let Some(&(b, e)) = pending.get(&key) {
                        let off = m.offset();
                        if off >= b && off < e {
                            out.entry(key.clone()).or_default().push(Record {
                                key: m.key().map(<[u8]>::to_vec),
                                value: m.payload().map(<[u8]>::to_vec),
                                offset: off,
                                timestamp: m.timestamp().to_millis(),
                                headers: m
                                    .headers()
                                    .map(|h| {
                                        h.iter()
                                            .map(|h| {
                                                (h.key.to_string(), h.value.map(<[u8]>::to_vec))
                                            })
                                            .collect()
                                    })
                                    .unwrap_or_default(),
                            });
                        }
                        if off + 1 >= e {
                            pending.remove(&key);
                        }
                    }
                }
                Some(Err(KafkaError::PartitionEOF(_))) | None => {
                    // Offsets may have gaps (transaction markers, compaction): a partition
                    // whose consumer position passed the end is done.
                    if let Ok(pos) = self.consumer.position() {
                        for e in pos.elements() {
                            if let KOffset::Offset(o) = e.offset() {
                                let key = (e.topic().to_string(), e.partition());
                                if pending.get(&key).is_some_and(|(_, end)| o >= *end) {
                                    pending.remove(&key);
                                }
                            }
                        }
                    }
                }
                Some(Err(KafkaError::MessageConsumption(
                    rdkafka::types::RDKafkaErrorCode::AutoOffsetReset,
                ))) => {
                    // Deleted between the low-watermark check and the fetch: the next read
                    // of the range finds the gap and reports it (see Data loss).
                    let (k, (b, e)) = pending
                        .iter()
                        .next()
                        .map(|(k, v)| (k.clone(), *v))
                        .unwrap_or_default();
                    return Err(data_lost(&self.asset, &k.0, k.1, b, e));
                }
                Some(Err(e)) => return Err(kafka_error("read records", e)),
            }
            if !pending.is_empty() && Instant::now() > deadline {
                let (k, (b, e)) = pending
                    .iter()
                    .next()
                    .map(|(k, v)| (k.clone(), *v))
                    .unwrap_or_default();
                return Err(Error::new(
                    &codes::IO_ERROR,
                    format!(
                        "kafka: reading offsets {b}..{e} of {}/{} did not complete within {:?} (records deleted by retention, or the broker is unreachable)",
                        k.0, k.1, self.options.read_timeout
                    ),
                ));
            }
        }
        let _ = self.consumer.unassign();
        Ok(out)
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
        let mut keys = Vec::new();
        let mut wants = Vec::new();
        for (t, ps) in &begin {
            for (p, b) in ps {
                let hi = if parts.iter().any(|(pt, pp)| pt == t && pp == p) {
                    self.watermarks(t, *p)?.1
                } else {
                    *b // a partition no longer listed keeps its position
                };
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
        for (t, p) in &parts {
            let mut b = begin[t][p];
            let e = end[t][p];
            if e > b {
                let (lo, _) = self.watermarks(t, *p)?;
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
        let records = self.fetch(&ranges)?;
        let mut builder: BatchBuilder = self.decoder.builder();
        for ((topic, partition), recs) in &records {
            // Good records with consecutive offsets make one origin run.
            let mut run: Option<(i64, u64)> = None;
            let close = |run: &mut Option<(i64, u64)>, out: &mut SourceBatch| {
                if let Some((first, n)) = run.take() {
                    out.origins
                        .push_run(self.position(topic, *partition, first), n);
                }
            };
            for r in recs {
                let fast = self.options.format == ValueFormat::Json
                    && self.push_fast(&mut builder, topic, *partition, r);
                let problem = if fast {
                    None
                } else {
                    match self.record_json(topic, *partition, r) {
                        Ok(v) => builder.push_json(&v).err(),
                        Err(p) => Some(p),
                    }
                };
                if problem.is_none() {
                    match &mut run {
                        Some((first, n)) if *first + *n as i64 == r.offset => *n += 1,
                        _ => {
                            close(&mut run, &mut out);
                            run = Some((r.offset, 1));
                        }
                    }
                }
                if let Some(problem) = problem {
                    let raw = r
                        .value
                        .as_deref()
                        .map(|v| String::from_utf8_lossy(v).into_owned())
                        .unwrap_or_default();
                    out.rejected.push(
                        problem.into_rejected(self.position(topic, *partition, r.offset), raw),
                    );
                }
                if builder.len() >= 8192 {
                    out.batches.extend(builder.finish()?);
                }
            }
            close(&mut run, &mut out);
        }
        out.batches.extend(builder.finish()?);
        Ok(out)
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

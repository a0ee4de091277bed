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

use crate::decode::ContractDecoder;
use etlantic_core::data::{Backlog, DataLoss, Offset};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::BindingOption;
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::BaseConsumer;
use rdkafka::topic_partition_list::Offset as KOffset;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

mod assignment;
mod offsets;
mod options;
mod rows;

use assignment::Assignment;
pub use offsets::proportional_split;
use offsets::{parse_offset, to_offset};
pub use options::{KafkaSourceOptions, StartingOffsets, ValueFormat, OPTIONS};
use rows::METADATA_COLUMNS;

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
    /// The partitions' end offsets as the last `latest_offset` found them: what
    /// [`Source::backlog`] measures the query's position against.
    ends: BTreeMap<(String, i32), i64>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("asset", &self.asset)
            .field("options", &self.options)
            .finish()
    }
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
        let state = ctx.state.clone();
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
            ends: BTreeMap::new(),
        })
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
        self.ends = highs.clone();
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

    fn backlog(&self, position: Option<&Offset>) -> Option<Backlog> {
        let position = parse_offset(position?).ok()?;
        let records = self
            .ends
            .iter()
            .filter_map(|((t, p), end)| {
                let at = position.get(t)?.get(p)?;
                Some(end.saturating_sub(*at).max(0) as u64)
            })
            .sum();
        Some(Backlog {
            records: Some(records),
            ..Default::default()
        })
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

//! The `kafka://` sink: rows as JSON record values, one Kafka transaction per micro-batch.
//!
//! # Binding
//!
//! `kafka://<bootstrap servers>/<topic>?key=<column>&transactions=true|false&progressTopic=<topic>&transactionalId=<id>&kafka.<librdkafka property>=<value>`
//!
//! - Every row becomes one record whose value is the row as a JSON object (the same
//!   rendering as the JSON-lines file sink). With `key=<column>` the record key is that
//!   column's value (text as is, other values as JSON); without it records have no key.
//! - `transactions` (default `true`): see the protocol below. `false` makes a plain
//!   idempotent producer (`acks=all`), declared
//!   [`SinkCommitProtocol::PlainAppend`] (at-least-once: a replayed batch is written
//!   again).
//! - `progressTopic` (default `<topic>.etlantic-progress`): the topic of the sink's
//!   progress markers. On a real cluster create it with `cleanup.policy=compact`; the
//!   sink reads it once when it opens.
//! - `transactionalId` overrides the derived transactional id (see below).
//! - `kafka.<property>`: passed to librdkafka as is.
//!
//! Output modes: append and update (changed rows are appended as new records). Complete
//! mode is refused: a Kafka topic cannot replace its previous content.
//!
//! # Protocol (transactions on)
//!
//! The producer's `transactional.id` is derived from the query id and the sink's asset
//! ([`transactional_id`]: `etlantic-<query id>-<asset>`), so it is the same for every
//! run of one checkpoint. The producer is opened at the first write (the query id is
//! known then): on a transactional broker `init_transactions` fences any producer of an
//! earlier run still alive with the same id (a zombie) and aborts its open transaction. The sink then reads its progress markers to learn the last batch it
//! committed ([`Sink::last_committed_batch`]).
//!
//! Each micro-batch is one transaction: `begin_transaction`, produce every row, flush
//! (every row acknowledged), produce a progress marker (key: the transactional id; value:
//! `{"query_id","sink","topic","batch_id","rows"}`) to the progress topic, flush, the
//! `in_sink` fail point ([`etlantic_core::faults`]), then
//! `commit_transaction`. Any failure aborts the transaction (`abort_transaction`) and
//! returns `ETL709`; the producer is then dropped and a new one is opened (and
//! re-initialised) at the next write. A batch whose id is at or below the last
//! committed one is recognised and not written again ([`WriteOutcome::AlreadyCommitted`]).
//!
//! Because the marker is in the batch's transaction, a `read_committed` consumer sees the
//! marker exactly when it sees the batch: the sink is declared
//! [`SinkCommitProtocol::Transactional`] with the condition "with a transactional Kafka
//! broker (read_committed consumers)".
//!
//! # What the tests prove, and what needs a real broker
//!
//! The tests run against librdkafka's mock cluster, which implements the transactional
//! *protocol* (InitProducerId, AddPartitionsToTxn, EndTxn, epochs) but neither writes
//! transaction markers nor filters aborted records for `read_committed` consumers: under
//! the mock every produced record is visible, committed or not. Nor does it fence a
//! zombie: its InitProducerId gives each new producer instance a fresh producer id and
//! keeps the old one valid. So the tests show: one transaction (one marker) per batch;
//! the transaction is aborted when producing fails and the batch can be retried (with
//! the mock's injected Produce error nothing of the batch reaches the log, and no
//! marker); a restarted sink derives the same transactional id and re-initialises
//! transactions; a replayed batch is recognised from the markers and not committed
//! twice; and, through the CLI killed at every fail point, 0 lost and 0 duplicated
//! records *as the mock's consumers see them*. What needs a transactional broker: that
//! an aborted or unfinished transaction stays invisible to `read_committed` consumers,
//! and that `init_transactions` fences a live zombie (the broker's epoch check). Within
//! one checkpoint, the checkpoint lock (`ETL803`) already keeps two live runs of a query
//! from writing at the same time.
//!
//! # Batch runs
//!
//! A batch run writes its rows in one transaction and neither reads nor writes progress
//! markers: a batch run has no checkpoint, so every run of a plan is a new write (batch
//! runs share one query id, the plan fingerprint, and batch id 0; deduplicating on them
//! would skip every run after the first).
//!
//! The rows are flushed (acknowledged) before the marker is produced, so the marker never
//! reaches the log for a batch whose rows did not (in the mock too). A crash between
//! producing and commit leaves rows and marker in the mock's log and the replay is
//! skipped; on a real broker the transaction is aborted, the marker is invisible and the
//! batch is written again.
//!
//! Producer calls (`init_transactions`, `flush`, `commit_transaction`, ...) are blocking
//! librdkafka calls bounded by a 30 s timeout.

use async_trait::async_trait;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::faults;
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use etlantic_core::uri::BindingUri;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::topic_partition_list::{Offset as KOffset, TopicPartitionList};
use rdkafka::ClientContext;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The condition of the transactional sink's exactly-once declaration.
pub const TRANSACTIONAL_CONDITION: &str =
    "with a transactional Kafka broker (read_committed consumers)";

const TIMEOUT: Duration = Duration::from_secs(30);

/// The provider of `kafka://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct KafkaSinkProvider;

inventory::submit! { SinkRegistration(&KafkaSinkProvider) }

/// The options of a `kafka://` sink binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KafkaSinkOptions {
    /// `bootstrap.servers`.
    pub bootstrap: String,
    /// The topic written.
    pub topic: String,
    /// `key=`: the column used as record key.
    pub key: Option<String>,
    /// `transactions=` (default true).
    pub transactions: bool,
    /// `progressTopic=`.
    pub progress_topic: String,
    /// `transactionalId=`.
    pub transactional_id: Option<String>,
    /// `kafka.*` properties.
    pub client: BTreeMap<String, String>,
}

impl KafkaSinkOptions {
    /// Parses a `kafka://` sink URI (`ETL007` for a bad one).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let bad = |why: String| {
            Error::new(
                &codes::BAD_URI,
                format!("binding `{}`: {why}", uri.redacted()),
            )
        };
        let (servers, topic) = uri.location.split_once('/').unwrap_or((&uri.location, ""));
        let topic = topic.trim();
        if servers.trim().is_empty() || topic.is_empty() || topic.contains(',') {
            return Err(bad(
                "expected kafka://<host:port[,host:port]>/<topic> (one topic)".into(),
            ));
        }
        let mut o = KafkaSinkOptions {
            bootstrap: servers.trim().to_string(),
            topic: topic.to_string(),
            key: None,
            transactions: true,
            progress_topic: format!("{topic}.etlantic-progress"),
            transactional_id: None,
            client: BTreeMap::new(),
        };
        for (k, v) in &uri.params {
            match k.as_str() {
                "key" => o.key = Some(v.clone()),
                "transactions" => {
                    o.transactions = match v.as_str() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(bad(format!("`transactions={v}`: expected true or false")))
                        }
                    }
                }
                "progressTopic" | "progress_topic" => o.progress_topic = v.clone(),
                "transactionalId" | "transactional_id" => o.transactional_id = Some(v.clone()),
                p if p.starts_with("kafka.") => {
                    o.client.insert(p["kafka.".len()..].to_string(), v.clone());
                }
                _ => {
                    return Err(bad(format!(
                        "unknown parameter `{k}` for the Kafka sink (known: {})",
                        option_names(OPTIONS)
                    )))
                }
            }
        }
        Ok(o)
    }
}

/// The transactional id of the sink of `asset` in query `query_id`.
pub fn transactional_id(query_id: &str, asset: &str) -> String {
    format!("etlantic-{query_id}-{asset}")
}

/// The query parameters of a `kafka://` sink binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "key",
        default: "none (records have no key)",
        meaning: "The column whose value becomes the record key: text as is, other values as JSON.",
    },
    BindingOption {
        name: "transactions",
        default: "true",
        meaning: "One Kafka transaction per micro-batch (exactly once); `false` uses a plain idempotent producer (at least once).",
    },
    BindingOption {
        name: "progressTopic",
        default: "`<topic>.etlantic-progress`",
        meaning: "The topic of the sink's progress markers (should be compacted; also `progress_topic`).",
    },
    BindingOption {
        name: "transactionalId",
        default: "`etlantic-<query id>-<asset>`",
        meaning: "Overrides the producer's derived `transactional.id` (also `transactional_id`).",
    },
    BindingOption {
        name: "kafka.<property>",
        default: "",
        meaning: "Passed to librdkafka as is; `enable.idempotence`, `acks` and `transactional.id` are always the sink's own.",
    },
];

impl SinkProvider for KafkaSinkProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "kafka"
    }

    fn description(&self) -> &'static str {
        "A Kafka topic (JSON values; one transaction per batch, or plain at-least-once)"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        let o = KafkaSinkOptions::from_uri(uri)?;
        Ok(SinkCapabilities {
            batch: true,
            streaming: true,
            output_modes: vec![OutputMode::Append, OutputMode::Update],
            guarantee: if o.transactions {
                SinkGuarantee {
                    protocol: SinkCommitProtocol::Transactional,
                    condition: Some(TRANSACTIONAL_CONDITION.to_string()),
                }
            } else {
                SinkGuarantee::new(SinkCommitProtocol::PlainAppend)
            },
        })
    }

    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        Ok(Box::new(KafkaSink::new(ctx)?))
    }
}

/// Remembers the first delivery failure of the current batch. Records carry their
/// batch's generation as delivery opaque, so late reports of an earlier, aborted batch
/// (e.g. records purged by `abort_transaction`) are not blamed on the current one.
#[derive(Clone, Default)]
struct DeliveryErrors {
    generation: Arc<AtomicUsize>,
    first: Arc<Mutex<Option<String>>>,
}

impl DeliveryErrors {
    /// Starts a new batch: a new generation, no failure yet.
    fn next_generation(&self) -> usize {
        *self.first.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.generation.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn take(&self) -> Option<String> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).take()
    }
}

impl ClientContext for DeliveryErrors {}

impl ProducerContext for DeliveryErrors {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, generation: usize) {
        if let Err((e, _)) = result {
            if generation == self.generation.load(Ordering::SeqCst) {
                let mut slot = self.first.lock().unwrap_or_else(|p| p.into_inner());
                slot.get_or_insert_with(|| e.to_string());
            }
        }
    }
}

struct Open {
    producer: BaseProducer<DeliveryErrors>,
    errors: DeliveryErrors,
    query_id: String,
    txn_id: String,
    last_committed: Option<u64>,
}

/// A `kafka://` sink (see the [module docs](self)).
pub struct KafkaSink {
    asset: String,
    options: KafkaSinkOptions,
    open: Option<Open>,
    /// A batch run: no progress markers (see the module docs).
    batch_run: bool,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("asset", &self.asset)
            .field("options", &self.options)
            .finish()
    }
}

fn write_failed(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::SINK_WRITE_FAILED,
        format!("kafka sink: {what}: {e}"),
    )
}

/// The rows of a table as JSON objects, one string per row, in order.
pub fn rows_as_json(table: &Table) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(table.num_rows());
    for batch in &table.batches {
        let mut w = arrow::json::LineDelimitedWriter::new(Vec::new());
        w.write(batch)
            .and_then(|_| w.finish())
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}")))?;
        let text = String::from_utf8(w.into_inner())
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow json: {e}")))?;
        out.extend(text.lines().map(String::from));
    }
    Ok(out)
}

impl KafkaSink {
    /// Creates the sink (no I/O: the producer is opened at the first write).
    pub fn new(ctx: SinkContext) -> Result<Self> {
        let options = KafkaSinkOptions::from_uri(&ctx.uri)?;
        if ctx.output_mode == OutputMode::Complete {
            return Err(Error::new(
                &codes::SINK_MODE_UNSUPPORTED,
                "the Kafka sink cannot replace a topic's content: use append or update output mode",
            ));
        }
        if let Some(k) = &options.key {
            if ctx.schema.field_with_name(k).is_err() {
                return Err(Error::new(
                    &codes::BAD_URI,
                    format!(
                        "binding `{}`: the key column `{k}` is not in the sink's schema",
                        ctx.uri.redacted()
                    ),
                ));
            }
        }
        Ok(KafkaSink {
            asset: ctx.asset,
            options,
            open: None,
            batch_run: ctx.mode == ExecutionMode::Batch,
        })
    }

    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.options.bootstrap);
        for (k, v) in &self.options.client {
            c.set(k, v);
        }
        c
    }

    /// Opens the producer for `query_id` (transactional: `init_transactions`, fencing
    /// earlier producers, then reads the last committed batch from the markers).
    fn ensure_open(&mut self, query_id: &str) -> Result<&mut Open> {
        if self.open.as_ref().is_some_and(|o| o.query_id != query_id) {
            self.open = None;
        }
        if self.open.is_none() {
            let txn_id = self
                .options
                .transactional_id
                .clone()
                .unwrap_or_else(|| transactional_id(query_id, &self.asset));
            let mut config = self.config();
            config.set("enable.idempotence", "true").set("acks", "all");
            if self.options.transactions {
                config.set("transactional.id", &txn_id);
            }
            let errors = DeliveryErrors::default();
            let producer: BaseProducer<DeliveryErrors> = config
                .create_with_context(errors.clone())
                .map_err(|e| kafka_error("create a producer", e))?;
            let mut last_committed = None;
            if self.options.transactions {
                producer
                    .init_transactions(TIMEOUT)
                    .map_err(|e| write_failed("init_transactions", e))?;
                if !self.batch_run {
                    last_committed = self.read_progress(query_id, &txn_id)?;
                }
            }
            self.open = Some(Open {
                producer,
                errors,
                query_id: query_id.to_string(),
                txn_id,
                last_committed,
            });
        }
        Ok(self.open.as_mut().expect("opened above"))
    }

    /// The highest batch id in the progress markers of `txn_id` (read_committed).
    fn read_progress(&self, query_id: &str, txn_id: &str) -> Result<Option<u64>> {
        let mut config = self.config();
        config
            .set("group.id", format!("{txn_id}-progress"))
            .set("enable.auto.commit", "false")
            .set("allow.auto.create.topics", "false")
            .set("isolation.level", "read_committed");
        let records = read_to_end(&config, &self.options.progress_topic, TIMEOUT)?;
        let mut last: Option<u64> = None;
        for (key, value) in records {
            if key.as_deref() != Some(txn_id.as_bytes()) {
                continue;
            }
            let Some(v) = value.and_then(|v| serde_json::from_slice::<Value>(&v).ok()) else {
                continue;
            };
            if v["query_id"] != query_id {
                continue;
            }
            if let Some(b) = v["batch_id"].as_u64() {
                last = Some(last.map_or(b, |l| l.max(b)));
            }
        }
        Ok(last)
    }

    fn produce_rows(&self, open: &Open, rows: &[String], generation: usize) -> Result<()> {
        for row in rows {
            let key = match &self.options.key {
                Some(k) => match serde_json::from_str::<Value>(row) {
                    Ok(v) => match v.get(k) {
                        Some(Value::String(s)) => Some(s.clone()),
                        Some(Value::Null) | None => None,
                        Some(other) => Some(other.to_string()),
                    },
                    Err(_) => None,
                },
                None => None,
            };
            let mut rec = BaseRecord::<String, String, usize>::with_opaque_to(
                &self.options.topic,
                generation,
            )
            .payload(row);
            if let Some(k) = &key {
                rec = rec.key(k);
            }
            send(&open.producer, rec)?;
        }
        Ok(())
    }

    /// Flushes and reports the first delivery failure.
    fn flushed(&self, open: &Open) -> Result<()> {
        open.producer
            .flush(TIMEOUT)
            .map_err(|e| write_failed("flush", e))?;
        if let Some(e) = open.errors.take() {
            return Err(write_failed("a record was not delivered", e));
        }
        Ok(())
    }

    fn transaction(&self, open: &Open, batch: &SinkBatch<'_>, rows: &[String]) -> Result<()> {
        let generation = open.errors.next_generation();
        open.producer
            .begin_transaction()
            .map_err(|e| write_failed("begin_transaction", e))?;
        self.produce_rows(open, rows, generation)?;
        // Every row acknowledged before the marker is produced: the marker never reaches
        // the log of a batch whose rows did not (also in the mock cluster).
        self.flushed(open)?;
        if self.batch_run {
            faults::check(faults::IN_SINK, batch.batch_id);
            return open
                .producer
                .commit_transaction(TIMEOUT)
                .map_err(|e| write_failed("commit_transaction", e));
        }
        let marker = json!({
            "query_id": batch.query_id,
            "sink": self.asset,
            "topic": self.options.topic,
            "batch_id": batch.batch_id,
            "rows": rows.len(),
        })
        .to_string();
        send(
            &open.producer,
            BaseRecord::<String, String, usize>::with_opaque_to(
                &self.options.progress_topic,
                generation,
            )
            .key(&open.txn_id)
            .payload(&marker),
        )?;
        self.flushed(open)?;
        faults::check(faults::IN_SINK, batch.batch_id);
        open.producer
            .commit_transaction(TIMEOUT)
            .map_err(|e| write_failed("commit_transaction", e))
    }
}

fn send(
    producer: &BaseProducer<DeliveryErrors>,
    rec: BaseRecord<'_, String, String, usize>,
) -> Result<()> {
    let mut rec = rec;
    loop {
        match producer.send(rec) {
            Ok(()) => return Ok(()),
            Err((
                rdkafka::error::KafkaError::MessageProduction(
                    rdkafka::types::RDKafkaErrorCode::QueueFull,
                ),
                r,
            )) => {
                producer.poll(Duration::from_millis(50));
                rec = r;
            }
            Err((e, _)) => return Err(write_failed("produce", e)),
        }
    }
}

#[async_trait]
impl Sink for KafkaSink {
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        let rows = rows_as_json(batch.data)?;
        let transactions = self.options.transactions;
        self.ensure_open(batch.query_id)?;
        let open = self.open.take().expect("opened above");
        if !transactions {
            let generation = open.errors.next_generation();
            let result = self
                .produce_rows(&open, &rows, generation)
                .and_then(|_| self.flushed(&open));
            self.open = Some(open);
            result?;
            return Ok(WriteOutcome::Written {
                rows: rows.len() as u64,
            });
        }
        if open.last_committed.is_some_and(|l| batch.batch_id <= l) {
            self.open = Some(open);
            return Ok(WriteOutcome::AlreadyCommitted);
        }
        match self.transaction(&open, &batch, &rows) {
            Ok(()) => {
                let mut open = open;
                open.last_committed = Some(batch.batch_id);
                self.open = Some(open);
                Ok(WriteOutcome::Written {
                    rows: rows.len() as u64,
                })
            }
            Err(e) => {
                // Abort, then drop the producer: the next write opens a new one
                // (init_transactions, progress read back), so nothing of the failed
                // transaction's state (purged records, a bumped epoch) leaks into it.
                let _ = open.producer.abort_transaction(TIMEOUT);
                drop(open);
                Err(e)
            }
        }
    }

    async fn close(&mut self) -> Result<()> {
        if let Some(open) = &self.open {
            open.producer
                .flush(TIMEOUT)
                .map_err(|e| write_failed("flush", e))?;
        }
        Ok(())
    }

    async fn last_committed_batch(&mut self, query_id: &str) -> Result<Option<u64>> {
        if !self.options.transactions || self.batch_run {
            return Ok(None);
        }
        Ok(self.ensure_open(query_id)?.last_committed)
    }
}

/// A record's key and value.
type KeyValue = (Option<Vec<u8>>, Option<Vec<u8>>);

fn kafka_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(&codes::IO_ERROR, format!("kafka: cannot {what}: {e}"))
}

/// Every record (key, value) of `topic` from the low to the high watermarks of its
/// partitions; an unknown topic has none.
fn read_to_end(config: &ClientConfig, topic: &str, timeout: Duration) -> Result<Vec<KeyValue>> {
    let consumer: BaseConsumer = config
        .create()
        .map_err(|e| kafka_error("create a consumer", e))?;
    let md = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| kafka_error(&format!("fetch the metadata of `{topic}`"), e))?;
    let mut pending: BTreeMap<i32, i64> = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for t in md.topics() {
        if t.name() != topic || t.error().is_some() {
            continue;
        }
        for p in t.partitions() {
            let (lo, hi) = consumer
                .fetch_watermarks(topic, p.id(), timeout)
                .map_err(|e| kafka_error(&format!("fetch the watermarks of {topic}"), e))?;
            if hi > lo {
                pending.insert(p.id(), hi);
                tpl.add_partition_offset(topic, p.id(), KOffset::Offset(lo))
                    .map_err(|e| kafka_error("build the assignment", e))?;
            }
        }
    }
    let mut out = Vec::new();
    if pending.is_empty() {
        return Ok(out);
    }
    consumer
        .assign(&tpl)
        .map_err(|e| kafka_error("assign partitions", e))?;
    let deadline = Instant::now() + timeout;
    while !pending.is_empty() {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if let Some(&hi) = pending.get(&m.partition()) {
                    if m.offset() < hi {
                        out.push((m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec)));
                    }
                    if m.offset() + 1 >= hi {
                        pending.remove(&m.partition());
                    }
                }
            }
            Some(Err(e)) if !matches!(e, rdkafka::error::KafkaError::PartitionEOF(_)) => {
                return Err(kafka_error(&format!("read `{topic}`"), e))
            }
            _ => {
                // Transaction markers leave gaps: a partition whose position passed the
                // high watermark is done.
                if let Ok(pos) = consumer.position() {
                    for e in pos.elements() {
                        if let KOffset::Offset(o) = e.offset() {
                            if pending.get(&e.partition()).is_some_and(|hi| o >= *hi) {
                                pending.remove(&e.partition());
                            }
                        }
                    }
                }
            }
        }
        if !pending.is_empty() && Instant::now() > deadline {
            return Err(kafka_error(
                &format!("read `{topic}` to its end"),
                format!("no progress within {timeout:?}"),
            ));
        }
    }
    Ok(out)
}

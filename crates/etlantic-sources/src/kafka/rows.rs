//! From Kafka records to rows of the contract: the records the fast path does not take,
//! owned; the decoding of one partition's range into batches and origin runs; a
//! record's value and metadata columns as the JSON the decoder reads.

use super::{KafkaSource, ValueFormat};
use crate::decode::{BatchBuilder, RecordProblem};
use etlantic_core::data::SourcePosition;
use etlantic_core::diagnostics::Result;
use etlantic_core::plugin::SourceBatch;
use rdkafka::message::{BorrowedMessage, Headers, Message};
use serde_json::{json, Map, Value};

/// A record read, owned.
/// A record read, owned; made only for records the fast path does not take.
pub(super) struct Record {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    pub(super) offset: i64,
    timestamp: Option<i64>,
    headers: Vec<(String, Option<Vec<u8>>)>,
}

impl Record {
    pub(super) fn of(m: &BorrowedMessage<'_>) -> Record {
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

/// Decodes the records of one partition's range as they are polled, gathering the good
/// rows' offsets into origin runs.
pub(super) struct PartitionDecode<'a> {
    pub(super) source: &'a KafkaSource,
    pub(super) topic: &'a str,
    pub(super) partition: i32,
    /// The first offset and length of the current run of consecutive good records.
    pub(super) run: Option<(i64, u64)>,
}

/// Rows per Arrow batch a read makes.
const BATCH_ROWS: usize = 8192;

impl PartitionDecode<'_> {
    /// A record straight from librdkafka's buffer: the fast path reads the value in place.
    pub(super) fn borrowed(
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

    pub(super) fn owned(
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

    pub(super) fn close(&mut self, out: &mut SourceBatch) {
        if let Some((first, n)) = self.run.take() {
            out.origins
                .push_run(self.source.position(self.topic, self.partition, first), n);
        }
    }
}

impl KafkaSource {
    pub(super) fn position(&self, topic: &str, partition: i32, offset: i64) -> SourcePosition {
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
}

/// The metadata columns a record can give, as named in the `raw` format (the `json`
/// format prefixes them with `kafka_`).
pub(super) const METADATA_COLUMNS: [&str; 6] = [
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

//! The `rate://` generator: Spark's rate source.
//!
//! `rate://?rows_per_second=N&start_ms=T` produces rows with the columns `timestamp`
//! (`Timestamp(µs, "UTC")`) and `value` (`Int64`). Row `i` has `value = i` and
//! `timestamp = start + i * 1000 / N` milliseconds (integer division), where `start` is
//! `start_ms` when given (for deterministic tests) and otherwise the time the source
//! first started.
//!
//! The offset is the number of rows emitted (a JSON number); `read(start, end)` returns
//! rows `start..end` and is deterministic, hence replayable. The source is unbounded
//! only. [`Source::latest_offset`] is based on the wall time elapsed since the source
//! first started (`elapsed_ms * N / 1000` rows, capped by [`ReadLimit::max_records`]);
//! the start time is stored in the source's state directory (`rate.json`) so that a
//! restarted query continues where it left off.
//!
//! The source's contract may hold both columns or one of them (by name); the timestamp
//! may use any unit and time zone.

use crate::decode::millis_to_unit;
use arrow::array::{
    ArrayRef, Int64Array, RecordBatch, RecordBatchOptions, TimestampMicrosecondArray,
    TimestampMillisecondArray, TimestampNanosecondArray, TimestampSecondArray,
};
use arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use etlantic_core::data::Offset;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{option_names, BindingOption};
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Rows per batch returned by `read`.
const BATCH_ROWS: u64 = 8192;

/// The provider of `rate://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct RateSourceProvider;

inventory::submit! { SourceRegistration(&RateSourceProvider) }

/// The options of a `rate://` binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateOptions {
    /// Rows generated per second of wall time (default 1).
    pub rows_per_second: u64,
    /// Fixed event-time start in epoch milliseconds (default: when the source started).
    pub start_ms: Option<i64>,
}

impl RateOptions {
    /// Parses `rows_per_second` (also `rowsPerSecond`) and `start_ms`; any other
    /// parameter is an error (`ETL007`).
    pub fn from_uri(uri: &BindingUri) -> Result<Self> {
        let mut o = RateOptions {
            rows_per_second: 1,
            start_ms: None,
        };
        let bad = |k: &str, v: &str, what: &str| {
            Error::new(
                &codes::BAD_URI,
                format!("`{uri}`: parameter `{k}={v}` is invalid, expected {what}"),
            )
        };
        for (k, v) in &uri.params {
            match k.as_str() {
                "rows_per_second" | "rowsPerSecond" => {
                    o.rows_per_second = v
                        .parse()
                        .ok()
                        .filter(|n| *n > 0)
                        .ok_or_else(|| bad(k, v, "a positive integer"))?
                }
                "start_ms" => {
                    o.start_ms = Some(v.parse().map_err(|_| bad(k, v, "epoch milliseconds"))?)
                }
                other => {
                    return Err(Error::new(
                        &codes::BAD_URI,
                        format!(
                            "`{uri}`: unknown parameter `{other}` for the rate source (known: {})",
                            option_names(OPTIONS)
                        ),
                    ))
                }
            }
        }
        Ok(o)
    }
}

/// The query parameters of a `rate://` source binding.
pub const OPTIONS: &[BindingOption] = &[
    BindingOption {
        name: "rows_per_second",
        default: "1",
        meaning: "Rows generated per second of wall time (also `rowsPerSecond`).",
    },
    BindingOption {
        name: "start_ms",
        default: "when the source first started",
        meaning:
            "The event time of the first row in epoch milliseconds, for deterministic timestamps.",
    },
];

impl SourceProvider for RateSourceProvider {
    fn options(&self) -> &'static [BindingOption] {
        OPTIONS
    }

    fn scheme(&self) -> &'static str {
        "rate"
    }

    fn description(&self) -> &'static str {
        "Generator of (timestamp, value) rows at a fixed rate, like Spark's rate source"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        RateOptions::from_uri(uri)?;
        Ok(SourceCapabilities {
            bounded: false,
            unbounded: true,
            guarantee: SourceGuarantee::Replayable,
        })
    }

    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        Ok(Box::new(RateSource::new(ctx)?))
    }
}

#[derive(Clone, Copy, Debug)]
enum Column {
    Timestamp(TimeUnit),
    Value,
}

/// What the source stores in its state directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct RateState {
    /// Wall-clock time the source first started (epoch milliseconds).
    wall_start_ms: i64,
}

/// A `rate://` source.
#[derive(Debug)]
pub struct RateSource {
    schema: SchemaRef,
    columns: Vec<Column>,
    options: RateOptions,
    wall_start_ms: i64,
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl RateSource {
    /// Creates the source, checking that the schema's columns are `timestamp`
    /// (a timestamp) and/or `value` (`Int64`), and loading or storing the start time.
    pub fn new(ctx: SourceContext) -> Result<Self> {
        let options = RateOptions::from_uri(&ctx.uri)?;
        let mut columns = Vec::new();
        for f in ctx.schema.fields() {
            columns.push(match (f.name().as_str(), f.data_type()) {
                ("timestamp", DataType::Timestamp(unit, _)) => Column::Timestamp(*unit),
                ("value", DataType::Int64) => Column::Value,
                _ => {
                    return Err(Error::new(
                        &codes::PORT_TYPE_MISMATCH,
                        format!(
                            "asset `{}`: the rate source produces `timestamp` (timestamp) and `value` (Int64); the contract has `{}` ({})",
                            ctx.asset,
                            f.name(),
                            f.data_type()
                        ),
                    ))
                }
            });
        }
        let wall_start_ms = match &ctx.state {
            Some(state) => load_or_store_start(state.as_ref())?,
            None => now_ms(),
        };
        Ok(RateSource {
            schema: ctx.schema,
            columns,
            options,
            wall_start_ms,
        })
    }

    /// The wall-clock time the source first started (epoch milliseconds).
    pub fn wall_start_ms(&self) -> i64 {
        self.wall_start_ms
    }

    /// The event time of row `i` in epoch milliseconds.
    pub fn timestamp_ms(&self, i: u64) -> i64 {
        let start = self.options.start_ms.unwrap_or(self.wall_start_ms);
        start + ((i as i128 * 1000) / self.options.rows_per_second as i128) as i64
    }

    fn batch(&self, from: u64, to: u64) -> Result<RecordBatch> {
        let arrays: Vec<ArrayRef> = self
            .columns
            .iter()
            .zip(self.schema.fields())
            .map(|(c, f)| -> Result<ArrayRef> {
                Ok(match c {
                    Column::Value => {
                        Arc::new(Int64Array::from_iter_values((from..to).map(|i| i as i64)))
                    }
                    Column::Timestamp(unit) => {
                        let tz = match f.data_type() {
                            DataType::Timestamp(_, tz) => tz.clone(),
                            _ => None,
                        };
                        let values = (from..to)
                            .map(|i| millis_to_unit(self.timestamp_ms(i), *unit))
                            .collect::<Option<Vec<i64>>>()
                            .ok_or_else(|| {
                                Error::new(&codes::ENGINE_ERROR, "rate source timestamp overflow")
                            })?;
                        match unit {
                            TimeUnit::Second => {
                                Arc::new(TimestampSecondArray::from(values).with_timezone_opt(tz))
                            }
                            TimeUnit::Millisecond => Arc::new(
                                TimestampMillisecondArray::from(values).with_timezone_opt(tz),
                            ),
                            TimeUnit::Microsecond => Arc::new(
                                TimestampMicrosecondArray::from(values).with_timezone_opt(tz),
                            ),
                            TimeUnit::Nanosecond => Arc::new(
                                TimestampNanosecondArray::from(values).with_timezone_opt(tz),
                            ),
                        }
                    }
                })
            })
            .collect::<Result<_>>()?;
        RecordBatch::try_new_with_options(
            self.schema.clone(),
            arrays,
            &RecordBatchOptions::new().with_row_count(Some((to - from) as usize)),
        )
        .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}")))
    }
}

/// The wall-clock start kept in the source's state (`rate.json`), written the first time.
fn load_or_store_start(state: &dyn etlantic_core::storage::Storage) -> Result<i64> {
    match state.read("rate.json")? {
        Some(bytes) => {
            let s: RateState = serde_json::from_slice(&bytes).map_err(|e| {
                Error::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!(
                        "rate source state `{}` is corrupt: {e}",
                        state.display("rate.json")
                    ),
                )
            })?;
            Ok(s.wall_start_ms)
        }
        None => {
            let s = RateState {
                wall_start_ms: now_ms(),
            };
            etlantic_core::storage::put_bytes(
                state,
                "rate.json",
                serde_json::to_string(&s)
                    .expect("state serialises")
                    .as_bytes(),
            )?;
            Ok(s.wall_start_ms)
        }
    }
}

fn parse(offset: &Offset) -> Result<u64> {
    offset.0.as_u64().ok_or_else(|| {
        Error::new(
            &codes::CHECKPOINT_CORRUPT,
            format!("`{}` is not an offset of the rate source", offset.0),
        )
    })
}

#[async_trait::async_trait]
impl Source for RateSource {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        let from = start.map(parse).transpose()?.unwrap_or(0);
        let elapsed = (now_ms() - self.wall_start_ms).max(0) as u128;
        let available = (elapsed * self.options.rows_per_second as u128 / 1000) as u64;
        let mut end = available.max(from);
        if let Some(max) = limit.max_records {
            end = end.min(from.saturating_add(max));
        }
        if end == from {
            return Ok(start.cloned());
        }
        Ok(Some(Offset(serde_json::json!(end))))
    }

    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch> {
        let from = start.map(parse).transpose()?.unwrap_or(0);
        let to = parse(end)?;
        let mut out = SourceBatch::default();
        let mut i = from;
        while i < to {
            let j = (i + BATCH_ROWS).min(to);
            out.batches.push(self.batch(i, j)?);
            i = j;
        }
        Ok(out)
    }
}

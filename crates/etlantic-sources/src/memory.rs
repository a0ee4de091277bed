//! The `memory://<name>` source: a process-global registry of in-memory streams that
//! tests and the conformance runner feed with [`MemoryStream`].
//!
//! A stream is a sequence of pushed Arrow batches. The offset is the number of batches
//! pushed so far (a JSON number), so `read(start, end)` returns the batches
//! `start..end` — the same ones on every call (replayable). A bounded read returns
//! everything pushed so far. Pushed batches are conformed to the source's contract like
//! Parquet rows (lossless casts; nulls in required columns and constraint violations
//! become rejected records whose position `row` is the 0-based row over the whole
//! stream).
//!
//! ```
//! use arrow::array::{Int64Array, RecordBatch};
//! use arrow::datatypes::{DataType, Field, Schema};
//! use etlantic_sources::memory::MemoryStream;
//! use std::sync::Arc;
//!
//! let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, false)]));
//! MemoryStream::register("doc-example", schema.clone());
//! let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
//! assert_eq!(MemoryStream::push("doc-example", batch).unwrap(), 1);
//! ```

use crate::decode::{row_as_json, ContractDecoder};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use etlantic_core::data::{Offset, SourcePosition};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{
    ReadLimit, Source, SourceBatch, SourceCapabilities, SourceContext, SourceProvider,
    SourceRegistration,
};
use etlantic_core::uri::BindingUri;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};

#[derive(Debug)]
struct Stream {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
}

static STREAMS: LazyLock<Mutex<HashMap<String, Stream>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn streams() -> MutexGuard<'static, HashMap<String, Stream>> {
    STREAMS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process-global registry of in-memory streams read by `memory://<name>`.
#[derive(Clone, Copy, Debug)]
pub struct MemoryStream;

impl MemoryStream {
    /// Creates (or resets to empty) the stream `name` with batches of `schema`.
    pub fn register(name: &str, schema: SchemaRef) {
        streams().insert(
            name.to_string(),
            Stream {
                schema,
                batches: Vec::new(),
            },
        );
    }

    /// Appends a batch to the stream `name`; returns the new offset (the number of
    /// batches pushed). The batch must have the registered schema (`ETL301` otherwise)
    /// and the stream must be registered (`ETL706` otherwise).
    pub fn push(name: &str, batch: RecordBatch) -> Result<u64> {
        let mut all = streams();
        let stream = all.get_mut(name).ok_or_else(|| {
            Error::new(
                &codes::IO_ERROR,
                format!("memory stream `{name}` is not registered"),
            )
        })?;
        if batch.schema().fields() != stream.schema.fields() {
            return Err(Error::new(
                &codes::PORT_TYPE_MISMATCH,
                format!(
                    "memory stream `{name}`: the batch schema {:?} differs from the registered {:?}",
                    batch.schema(),
                    stream.schema
                ),
            ));
        }
        stream.batches.push(batch);
        Ok(stream.batches.len() as u64)
    }

    /// Number of batches pushed to `name` (`None` when it is not registered).
    pub fn len(name: &str) -> Option<u64> {
        streams().get(name).map(|s| s.batches.len() as u64)
    }

    /// Removes the stream `name`.
    pub fn remove(name: &str) {
        streams().remove(name);
    }
}

/// The provider of `memory://` sources.
#[derive(Clone, Copy, Debug, Default)]
pub struct MemorySourceProvider;

inventory::submit! { SourceRegistration(&MemorySourceProvider) }

impl SourceProvider for MemorySourceProvider {
    fn scheme(&self) -> &'static str {
        "memory"
    }

    fn description(&self) -> &'static str {
        "In-memory streams fed by tests (etlantic_sources::memory::MemoryStream)"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SourceCapabilities> {
        stream_name(uri)?;
        Ok(SourceCapabilities {
            bounded: true,
            unbounded: true,
            guarantee: SourceGuarantee::Replayable,
        })
    }

    /// Creates the source; a stream that is not registered yet is registered empty with
    /// the source's schema.
    fn create(&self, ctx: SourceContext) -> Result<Box<dyn Source>> {
        let name = stream_name(&ctx.uri)?;
        let decoder = ContractDecoder::new(ctx.schema.clone(), ctx.contract.as_deref())?;
        streams().entry(name.clone()).or_insert_with(|| Stream {
            schema: ctx.schema.clone(),
            batches: Vec::new(),
        });
        Ok(Box::new(MemorySource {
            name,
            asset: ctx.asset,
            decoder,
        }))
    }
}

fn stream_name(uri: &BindingUri) -> Result<String> {
    let name = uri.location.trim_matches('/');
    if name.is_empty() {
        return Err(Error::new(
            &codes::BAD_URI,
            format!(
                "`{}`: a memory binding needs a stream name, e.g. memory://orders",
                uri
            ),
        ));
    }
    Ok(name.to_string())
}

/// A `memory://<name>` source.
#[derive(Debug)]
pub struct MemorySource {
    name: String,
    asset: String,
    decoder: ContractDecoder,
}

fn parse(offset: &Offset) -> Result<u64> {
    offset.0.as_u64().ok_or_else(|| {
        Error::new(
            &codes::CHECKPOINT_CORRUPT,
            format!("`{}` is not an offset of a memory source", offset.0),
        )
    })
}

#[async_trait::async_trait]
impl Source for MemorySource {
    fn checks_record_rules(&self) -> bool {
        // Pushed batches are conformed to the contract, record rules included.
        true
    }

    fn schema(&self) -> SchemaRef {
        self.decoder.schema()
    }

    async fn latest_offset(
        &mut self,
        start: Option<&Offset>,
        limit: &ReadLimit,
    ) -> Result<Option<Offset>> {
        let from = start.map(parse).transpose()?.unwrap_or(0);
        let all = streams();
        let stream = all.get(&self.name).ok_or_else(|| {
            Error::new(
                &codes::IO_ERROR,
                format!("memory stream `{}` was removed", self.name),
            )
        })?;
        let pushed = stream.batches.len() as u64;
        let mut end = pushed.max(from);
        if let Some(max) = limit.max_records {
            // Whole batches, at least one, while the row budget allows.
            let mut rows = 0u64;
            let mut e = from;
            while e < pushed {
                let n = stream.batches[e as usize].num_rows() as u64;
                if e > from && rows + n > max {
                    break;
                }
                rows += n;
                e += 1;
            }
            end = e;
        }
        if end == from {
            return Ok(start.cloned());
        }
        Ok(Some(Offset(serde_json::json!(end))))
    }

    async fn read(&mut self, start: Option<&Offset>, end: &Offset) -> Result<SourceBatch> {
        let from = start.map(parse).transpose()?.unwrap_or(0) as usize;
        let to = parse(end)? as usize;
        let (batches, row_base) = {
            let all = streams();
            let stream = all.get(&self.name).ok_or_else(|| {
                Error::new(
                    &codes::IO_ERROR,
                    format!("memory stream `{}` was removed", self.name),
                )
            })?;
            if to > stream.batches.len() || from > to {
                return Err(Error::new(
                    &codes::CHECKPOINT_CORRUPT,
                    format!(
                        "memory stream `{}` has {} batches; cannot read ({from}, {to}]",
                        self.name,
                        stream.batches.len()
                    ),
                ));
            }
            let base: usize = stream.batches[..from].iter().map(|b| b.num_rows()).sum();
            (stream.batches[from..to].to_vec(), base as u64)
        };
        let mut out = SourceBatch::default();
        let mut row = row_base;
        for batch in batches {
            let conformed = self.decoder.conform_batch(&batch)?;
            for (i, problem) in conformed.rejected {
                let position = SourcePosition {
                    asset: self.asset.clone(),
                    row: Some(row + i as u64),
                    ..SourcePosition::default()
                };
                out.rejected
                    .push(problem.into_rejected(position, row_as_json(&batch, i)));
            }
            if conformed.batch.num_rows() > 0 {
                out.batches.push(conformed.batch);
            }
            row += batch.num_rows() as u64;
        }
        Ok(out)
    }
}

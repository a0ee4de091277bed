//! `foreach://<name>`: Spark's `foreachBatch` — every micro-batch is handed to a user
//! callback with its batch id.
//!
//! Register the callback before the query starts:
//!
//! ```
//! use etlantic_sinks::foreach::{register, ForeachBatch};
//! register("audit", std::sync::Arc::new(|batch: ForeachBatch<'_>| {
//!     println!("batch {} of {}: {} rows", batch.batch_id, batch.query_id, batch.data.num_rows());
//!     Ok(())
//! }));
//! ```
//!
//! The callback runs after the batch's offsets are logged and before its commit; after a
//! failure the same batch id is handed over again, so the sink is at-least-once (as in
//! Spark). Callbacks that write somewhere can use `(query_id, batch_id)` to make their
//! writes idempotent.

use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::guarantee::{SinkCommitProtocol, SinkGuarantee};
use etlantic_core::plugin::{
    Sink, SinkBatch, SinkCapabilities, SinkContext, SinkProvider, SinkRegistration, WriteOutcome,
};
use etlantic_core::streaming::OutputMode;
use etlantic_core::uri::BindingUri;
use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};

/// What a callback receives.
#[derive(Clone, Copy, Debug)]
pub struct ForeachBatch<'a> {
    /// The query id (stable across restarts).
    pub query_id: &'a str,
    /// The micro-batch id.
    pub batch_id: u64,
    /// The output mode of the rows.
    pub output_mode: OutputMode,
    /// The rows.
    pub data: &'a Table,
}

/// A foreach-batch callback.
pub type Callback = Arc<dyn Fn(ForeachBatch<'_>) -> Result<()> + Send + Sync>;

static CALLBACKS: LazyLock<Mutex<HashMap<String, Callback>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

/// Registers (or replaces) the callback named `name`.
pub fn register(name: &str, callback: Callback) {
    CALLBACKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(name.to_string(), callback);
}

/// Removes the callback named `name`.
pub fn unregister(name: &str) {
    CALLBACKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(name);
}

fn callback(name: &str) -> Option<Callback> {
    CALLBACKS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(name)
        .cloned()
}

fn name_of(uri: &BindingUri) -> Result<String> {
    let n = uri.location.trim_matches('/');
    if n.is_empty() {
        return Err(Error::new(
            &codes::BAD_URI,
            format!("`{uri}`: a foreach binding needs a name, e.g. foreach://audit"),
        ));
    }
    Ok(n.to_string())
}

/// The provider of `foreach://` sinks.
#[derive(Clone, Copy, Debug, Default)]
pub struct ForeachSinkProvider;

inventory::submit! { SinkRegistration(&ForeachSinkProvider) }

impl SinkProvider for ForeachSinkProvider {
    fn scheme(&self) -> &'static str {
        "foreach"
    }

    fn description(&self) -> &'static str {
        "Hands every batch to a registered callback with its batch id (Spark's foreachBatch), at-least-once"
    }

    fn capabilities(&self, uri: &BindingUri) -> Result<SinkCapabilities> {
        name_of(uri)?;
        Ok(SinkCapabilities {
            batch: true,
            streaming: true,
            output_modes: vec![OutputMode::Append, OutputMode::Update, OutputMode::Complete],
            guarantee: SinkGuarantee::new(SinkCommitProtocol::PlainAppend),
        })
    }

    fn create(&self, ctx: SinkContext) -> Result<Box<dyn Sink>> {
        let name = name_of(&ctx.uri)?;
        if callback(&name).is_none() {
            return Err(Error::new(
                &codes::SINK_WRITE_FAILED,
                format!("no foreach-batch callback is registered as `{name}`"),
            ));
        }
        Ok(Box::new(ForeachSink { name }))
    }
}

/// A sink that calls a registered callback.
pub struct ForeachSink {
    name: String,
}

#[async_trait::async_trait]
impl Sink for ForeachSink {
    async fn write(&mut self, batch: SinkBatch<'_>) -> Result<WriteOutcome> {
        let cb = callback(&self.name).ok_or_else(|| {
            Error::new(
                &codes::SINK_WRITE_FAILED,
                format!("the callback `{}` was unregistered", self.name),
            )
        })?;
        cb(ForeachBatch {
            query_id: batch.query_id,
            batch_id: batch.batch_id,
            output_mode: batch.output_mode,
            data: batch.data,
        })?;
        Ok(WriteOutcome::Written {
            rows: batch.data.num_rows() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int64Array, RecordBatch};
    use etlantic_core::streaming::ExecutionMode;

    #[tokio::test]
    async fn hands_each_batch_with_its_id() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        register(
            "t1",
            Arc::new(move |b: ForeachBatch<'_>| {
                s.lock().unwrap().push((b.batch_id, b.data.num_rows()));
                Ok(())
            }),
        );
        let batch =
            RecordBatch::try_from_iter(vec![("x", Arc::new(Int64Array::from(vec![1, 2])) as _)])
                .unwrap();
        let table = Table::new(batch.schema(), vec![batch]);
        let ctx = SinkContext {
            storage_options: Default::default(),
            asset: "a".into(),
            uri: BindingUri::parse("foreach://t1").unwrap(),
            schema: table.schema.clone(),
            contract: None,
            root: ".".into(),
            mode: ExecutionMode::Streaming,
            output_mode: OutputMode::Append,
        };
        let mut sink = ForeachSinkProvider.create(ctx.clone()).unwrap();
        for id in [0, 1] {
            sink.write(SinkBatch {
                query_id: "q",
                batch_id: id,
                output_mode: OutputMode::Append,
                data: &table,
            })
            .await
            .unwrap();
        }
        assert_eq!(*seen.lock().unwrap(), vec![(0, 2), (1, 2)]);
        unregister("t1");
        assert!(ForeachSinkProvider.create(ctx).is_err());
        let caps = ForeachSinkProvider
            .capabilities(&BindingUri::parse("foreach://t1").unwrap())
            .unwrap();
        assert_eq!(caps.guarantee.protocol, SinkCommitProtocol::PlainAppend);
    }
}

//! How a batch becomes one Delta commit: the action its output mode asks for, the `txn`
//! check that makes a replay a no-op, and the append, overwrite or merge that writes it.

use super::log_store::{FaultLogStore, DISARMED};
use super::schema::delta_batches;
use super::table::{load, table_session, txn_version};
use super::{DeltaSink, DeltaWriteMode};
use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use deltalake::datafusion::common::{Column, TableReference};
use deltalake::datafusion::logical_expr::Expr;
use deltalake::datafusion::prelude::SessionContext;
use deltalake::kernel::transaction::CommitProperties;
use deltalake::kernel::Transaction;
use deltalake::logstore::LogStoreRef;
use deltalake::protocol::SaveMode;
use deltalake::{DeltaResult, DeltaTable, DeltaTableConfig, DeltaTableError};
use etlantic_core::diagnostics::{codes, Diagnostic, Error, Result};
use etlantic_core::plugin::{SinkBatch, WriteOutcome};
use etlantic_core::streaming::{ExecutionMode, OutputMode};
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl DeltaSink {
    /// What a batch does to the table, or `ETL504` for an output mode the options cannot
    /// take.
    fn action(&self, output_mode: OutputMode) -> Result<Action> {
        if self.mode == ExecutionMode::Batch {
            return Ok(match &self.options.mode {
                DeltaWriteMode::Append => Action::Append,
                DeltaWriteMode::Overwrite => Action::Overwrite,
                DeltaWriteMode::Merge { keys } => Action::Merge(keys.clone()),
            });
        }
        match (output_mode, &self.options.mode) {
            (OutputMode::Complete, _) => Ok(Action::Overwrite),
            (OutputMode::Append, DeltaWriteMode::Append) => Ok(Action::Append),
            (OutputMode::Append | OutputMode::Update, DeltaWriteMode::Merge { keys }) => {
                Ok(Action::Merge(keys.clone()))
            }
            (mode, _) => Err(Error::from(
                Diagnostic::new(
                    &codes::SINK_MODE_UNSUPPORTED,
                    format!(
                        "the delta sink with `mode={}` does not take the {} output mode",
                        match self.options.mode {
                            DeltaWriteMode::Append => "append",
                            DeltaWriteMode::Merge { .. } => "merge",
                            DeltaWriteMode::Overwrite => "overwrite",
                        },
                        match mode {
                            OutputMode::Append => "append",
                            OutputMode::Update => "update",
                            OutputMode::Complete => "complete",
                        }
                    ),
                )
                .help(
                    "use `mode=merge&keys=...` for the update output mode; `complete` overwrites",
                ),
            )),
        }
    }

    pub(super) async fn write_inner(&mut self, batch: &SinkBatch<'_>) -> Result<WriteOutcome> {
        let rows = batch.data.num_rows() as u64;
        let streaming = self.mode == ExecutionMode::Streaming;
        let action = self.action(batch.output_mode)?;
        let store = self.store()?;
        let table = match self.table.take() {
            Some(mut t) => {
                t.update_incremental(None).await.map_err(|e| {
                    Error::new(
                        &codes::IO_ERROR,
                        format!("cannot load the Delta table `{}`: {e}", self.location),
                    )
                })?;
                Some(t)
            }
            None => load(store.clone() as LogStoreRef).await?,
        };
        if streaming {
            // What this sink committed itself needs no reading back: only the first
            // micro-batch after a start looks the query's `txn` up in the log.
            let known = self
                .last_txn
                .as_ref()
                .filter(|(q, _)| q == batch.query_id)
                .map(|(_, b)| *b as i64);
            if let Some(t) = &table {
                let committed = match known {
                    Some(v) => Some(v),
                    None => txn_version(t, batch.query_id).await?,
                };
                if let Some(v) = committed {
                    if v >= 0 && batch.batch_id <= v as u64 {
                        // The commit may be the one a killed process made before it synced
                        // it (the page cache kept it): the checkpoint is about to count on
                        // it.
                        if let Some(latest) = t.version() {
                            store.sync_version(latest).await.map_err(|e| {
                                Error::new(
                                    &codes::SINK_WRITE_FAILED,
                                    format!("cannot make the committed table durable: {e}"),
                                )
                            })?;
                        }
                        self.table = Some(t.clone());
                        return Ok(WriteOutcome::AlreadyCommitted);
                    }
                }
            }
        }
        let (schema, batches) = delta_batches(&batch.data.schema, &batch.data.batches)?;
        let mut props = CommitProperties::default();
        if streaming {
            let version = i64::try_from(batch.batch_id).map_err(|_| {
                Error::new(
                    &codes::SINK_WRITE_FAILED,
                    format!(
                        "batch id {} does not fit a Delta txn version",
                        batch.batch_id
                    ),
                )
            })?;
            props = props.with_application_transaction(Transaction::new_with_last_update(
                batch.query_id,
                version,
                Some(chrono::Utc::now().timestamp_millis()),
            ));
            store.batch.store(batch.batch_id, Ordering::SeqCst);
        }
        let result = self
            .commit(store.clone(), table, action, schema, batches, props)
            .await;
        store.batch.store(DISARMED, Ordering::SeqCst);
        // A failed commit leaves the table to be loaded afresh.
        self.table = Some(result?);
        if streaming {
            self.last_txn = Some((batch.query_id.to_string(), batch.batch_id));
        }
        Ok(WriteOutcome::Written { rows })
    }

    async fn commit(
        &self,
        store: Arc<FaultLogStore>,
        table: Option<DeltaTable>,
        action: Action,
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        props: CommitProperties,
    ) -> Result<DeltaTable> {
        let failed = |e: DeltaTableError| {
            Error::new(
                &codes::SINK_WRITE_FAILED,
                format!("cannot write the Delta table `{}`: {e}", self.location),
            )
        };
        let table = match table {
            Some(t) => t,
            None => DeltaTable::new(store as LogStoreRef, DeltaTableConfig::default()),
        };
        let exists = table.version().is_some();
        match action {
            Action::Merge(keys) if exists => {
                let nonempty: Vec<RecordBatch> =
                    batches.into_iter().filter(|b| b.num_rows() > 0).collect();
                if nonempty.is_empty() {
                    // Nothing to upsert: commit the txn alone (an append of nothing).
                    return self
                        .write_files(table, SaveMode::Append, schema, vec![], props)
                        .await
                        .map_err(failed);
                }
                let ctx = SessionContext::new();
                let source = ctx
                    .read_batches(nonempty)
                    .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("datafusion: {e}")))?;
                let qualified = |rel: &str, name: &str| {
                    Expr::Column(Column::new(Some(TableReference::bare(rel)), name))
                };
                let predicate = keys
                    .iter()
                    .map(|k| qualified("target", k).eq(qualified("source", k)))
                    .reduce(Expr::and)
                    .expect("merge keys are never empty");
                let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
                let names2 = names.clone();
                let session = table_session(table.log_store().as_ref());
                let (table, _) = table
                    .merge(source, predicate)
                    .with_session_state(session)
                    .with_source_alias("source")
                    .with_target_alias("target")
                    .with_commit_properties(props)
                    .when_matched_update(|u| {
                        names.iter().fold(u, |u, n| {
                            u.update(Column::new_unqualified(n.clone()), qualified("source", n))
                        })
                    })
                    .map_err(failed)?
                    .when_not_matched_insert(|i| {
                        names2.iter().fold(i, |i, n| {
                            i.set(Column::new_unqualified(n.clone()), qualified("source", n))
                        })
                    })
                    .map_err(failed)?
                    .await
                    .map_err(failed)?;
                Ok(table)
            }
            Action::Overwrite if exists => self
                .write_files(table, SaveMode::Overwrite, schema, batches, props)
                .await
                .map_err(failed),
            // Appends, and the first write of any mode (which creates the table).
            _ => self
                .write_files(table, SaveMode::Append, schema, batches, props)
                .await
                .map_err(failed),
        }
    }

    async fn write_files(
        &self,
        table: DeltaTable,
        save_mode: SaveMode,
        schema: SchemaRef,
        mut batches: Vec<RecordBatch>,
        props: CommitProperties,
    ) -> DeltaResult<DeltaTable> {
        if batches.is_empty() {
            batches.push(RecordBatch::new_empty(schema));
        }
        let mut builder = table
            .write(batches)
            .with_save_mode(save_mode)
            .with_commit_properties(props);
        if self.options.change_data_feed {
            builder = builder.with_configuration([(
                "delta.enableChangeDataFeed".to_string(),
                Some("true".to_string()),
            )]);
        }
        builder.await
    }
}

enum Action {
    Append,
    Overwrite,
    Merge(Vec<String>),
}

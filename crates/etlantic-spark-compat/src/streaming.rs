//! Streaming queries on Spark: a planned streaming pipeline run as one Spark Structured
//! Streaming query, driven the way a Spark user drives it (start, process everything
//! available, progress, stop).
//!
//! What is compiled:
//! - every source bound to a JSON-lines file location (`file://DIR?format=jsonl`):
//!   a streaming source is Spark's JSON file source on that directory with the
//!   contract's schema and `maxFilesPerTrigger=1` (one new file per micro-batch); a
//!   static source (`static_refresh`) is read once as a table. A source's event time and
//!   watermark become `withWatermark`;
//! - the transformations, in plan order, through [`crate::compile::streaming_plan`];
//! - the profile's `no_data_batches` and `watermark_policy`, as Spark's
//!   `noDataMicroBatches.enabled` and `multipleWatermarkPolicy` session settings;
//! - the one sink: Spark's memory sink under a query name, with the sink's output mode,
//!   a processing-time trigger and a checkpoint location. [`SparkStreamingQuery::sink_rows`]
//!   reads it back as Arrow.
//!
//! Everything here blocks (the Spark Connect client runs its own runtime): call it from
//! a blocking thread, never from an async task.

use crate::backend::connect;
use crate::compile::{self, Rel, ORD};
use crate::expr::{ident, Kind};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, SchemaRef};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::StepLogic;
use etlantic_core::streaming::OutputMode;
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::PipelinePlan;
use indexmap::IndexMap;
use spark_connect::session::SparkSession;
use spark_connect::streaming::{StreamingQuery, Trigger};
use std::path::Path;

fn engine(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(&codes::ENGINE_ERROR, format!("Spark: {what}: {e}"))
}

fn unsupported(what: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::BACKEND_UNSUPPORTED_ACTION,
        format!("a streaming query on Spark cannot {what}"),
    )
}

/// The Spark DDL type of a column.
fn ddl_type(column: &str, dt: &DataType) -> Result<String> {
    Ok(match dt {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => "BIGINT".into(),
        DataType::Float32 | DataType::Float64 => "DOUBLE".into(),
        DataType::Decimal128(p, s) => format!("DECIMAL({p},{s})"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "STRING".into(),
        DataType::Boolean => "BOOLEAN".into(),
        DataType::Date32 => "DATE".into(),
        DataType::Timestamp(_, Some(_)) => "TIMESTAMP".into(),
        DataType::Timestamp(_, None) => "TIMESTAMP_NTZ".into(),
        other => {
            return Err(Error::new(
                &codes::UNSUPPORTED_TYPE,
                format!(
                    "column `{column}` is {other}, which the Spark streaming reader does not read"
                ),
            ))
        }
    })
}

/// The schema as Spark DDL (`` `a` BIGINT, `b` STRING ``).
pub fn ddl(schema: &SchemaRef) -> Result<String> {
    Ok(schema
        .fields()
        .iter()
        .map(|f| {
            Ok(format!(
                "{} {}",
                ident(f.name()),
                ddl_type(f.name(), f.data_type())?
            ))
        })
        .collect::<Result<Vec<_>>>()?
        .join(", "))
}

/// The local path of a `file://` JSON-lines binding, relative to `root`.
fn json_path(binding: &str, root: &Path) -> Result<String> {
    let uri = BindingUri::parse(binding)?;
    let format = uri.param("format").unwrap_or("jsonl");
    if uri.scheme != "file" || !matches!(format, "jsonl" | "json") {
        return Err(unsupported(format!(
            "read `{}` yet (JSON-lines file locations only)",
            uri.redacted()
        )));
    }
    let p = Path::new(&uri.location);
    Ok(if p.is_absolute() {
        p.display().to_string()
    } else {
        root.join(p).display().to_string()
    })
}

fn output_mode(m: OutputMode) -> &'static str {
    match m {
        OutputMode::Append => "append",
        OutputMode::Update => "update",
        OutputMode::Complete => "complete",
    }
}

/// A running Spark streaming query of a pipeline.
pub struct SparkStreamingQuery {
    session: SparkSession,
    query: StreamingQuery,
    sink: String,
    columns: Vec<String>,
}

impl SparkStreamingQuery {
    /// Compiles the streaming pipeline `plan` and starts it at the Spark Connect
    /// endpoint `url`, its sink a memory table named `sink_table`. Relative file
    /// locations resolve against `root`. Spark's refusal of the query (an output mode
    /// it does not support for the operators, say) is an `ETL707` error here.
    pub fn start(
        plan: &PipelinePlan,
        url: &str,
        root: &Path,
        checkpoint: &Path,
        sink_table: &str,
        trigger_interval_ms: u64,
    ) -> Result<Self> {
        let session = connect(url)?;
        // The profile's streaming settings, as Spark's session settings.
        let conf = session.conf();
        let set = |k: &str, v: &str| {
            conf.set(k, v)
                .map_err(|e| engine(&format!("setting {k}"), e))
        };
        set(
            "spark.sql.streaming.noDataMicroBatches.enabled",
            if plan.profile.no_data_batches {
                "true"
            } else {
                "false"
            },
        )?;
        set(
            "spark.sql.streaming.multipleWatermarkPolicy",
            match plan.profile.watermark_policy {
                etlantic_core::streaming::WatermarkPolicy::Min => "min",
                etlantic_core::streaming::WatermarkPolicy::Max => "max",
            },
        )?;
        let mut relations: IndexMap<String, Rel> = IndexMap::new();
        for s in &plan.sources {
            let asset = plan.assets.get(&s.asset).ok_or_else(|| {
                Error::new(&codes::PLAN_INVALID, format!("no asset `{}`", s.asset))
            })?;
            let schema = plan.asset_contract(&s.asset)?.arrow_schema();
            let path = json_path(&asset.binding, root)?;
            let df = if s.static_refresh.is_some() {
                session
                    .read()
                    .schema(ddl(&schema)?)
                    .format("json")
                    .load(Some(&path))
            } else {
                session
                    .read_stream()
                    .format("json")
                    .schema(ddl(&schema)?)
                    .option("maxFilesPerTrigger", "1")
                    .load(Some(&path))
            };
            let df = match (&s.event_time, &s.watermark) {
                (Some(t), Some(delay)) => {
                    df.with_watermark(&t.column, &format!("{} milliseconds", delay.as_millis()))
                }
                _ => df,
            };
            let columns: Vec<(String, Kind)> = schema
                .fields()
                .iter()
                .map(|f| (f.name().clone(), Kind::of(f.data_type())))
                .collect();
            let mut cols: Vec<spark_connect::Column> = columns
                .iter()
                .map(|(n, _)| spark_connect::functions::col(n))
                .collect();
            cols.push(spark_connect::functions::expr(&format!(
                "array(0L) AS {}",
                ident(ORD)
            )));
            relations.insert(
                s.id.clone(),
                Rel {
                    df: df.select(cols),
                    columns,
                },
            );
        }
        for t in &plan.transforms {
            let task = plan.step_task(&t.id)?;
            let StepLogic::Portable {
                plan: p,
                parameters,
                output,
            } = &task.logic
            else {
                return Err(unsupported(format!("run `{}` (not a portable plan)", t.id)));
            };
            let ports = task.port_inputs(&relations)?;
            let rel = compile::streaming_plan(p.decoded(), parameters, &ports, output)
                .map_err(|e| e.map_diagnostics(|d| d.at(format!("transforms[{}]", t.id))))?;
            relations.insert(t.id.clone(), rel);
        }
        let [sink] = plan.sinks.as_slice() else {
            return Err(unsupported("write to more than one sink per query yet"));
        };
        let rel = relations.get(&sink.input).ok_or_else(|| {
            Error::new(
                &codes::UNKNOWN_NODE,
                format!("sink `{}` reads unknown `{}`", sink.id, sink.input),
            )
        })?;
        let columns: Vec<String> = rel.columns.iter().map(|(n, _)| n.clone()).collect();
        let out = rel
            .df
            .select(columns.iter().map(|c| spark_connect::functions::col(c)));
        let query = out
            .write_stream()
            .format("memory")
            .query_name(sink_table)
            .output_mode(output_mode(sink.output_mode))
            .trigger(Trigger::ProcessingTime(format!(
                "{trigger_interval_ms} milliseconds"
            )))
            .option("checkpointLocation", &checkpoint.display().to_string())
            .start("")
            .map_err(|e| engine("starting the query", e))?;
        Ok(SparkStreamingQuery {
            session,
            query,
            sink: sink_table.to_string(),
            columns,
        })
    }

    /// Blocks until every file available now has been processed (Spark's
    /// `processAllAvailable`).
    pub fn process_all_available(&self) -> Result<()> {
        self.query
            .process_all_available()
            .map_err(|e| engine("processAllAvailable", e))
    }

    /// Everything the memory sink holds, as Arrow (append/update: every row emitted so
    /// far in emission order; complete: the last result table).
    pub fn sink_rows(&self) -> Result<Vec<RecordBatch>> {
        let cols = self
            .columns
            .iter()
            .map(|c| ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let df = self
            .session
            .sql(&format!("SELECT {cols} FROM {}", ident(&self.sink)))
            .map_err(|e| engine("reading the memory sink", e))?;
        df.collect_record_batches()
            .map_err(|e| engine("reading the memory sink", e))
    }

    /// Spark's last progress record (its own JSON).
    pub fn last_progress(&self) -> Result<Option<serde_json::Value>> {
        let p = self
            .query
            .last_progress()
            .map_err(|e| engine("lastProgress", e))?;
        Ok(p.and_then(|text| serde_json::from_str(&text).ok()))
    }

    /// Stops the query.
    pub fn stop(&self) -> Result<()> {
        self.query
            .stop()
            .map_err(|e| engine("stopping the query", e))
    }
}

impl Drop for SparkStreamingQuery {
    fn drop(&mut self) {
        // A query left running keeps triggering on the server.
        let _ = self.query.stop();
    }
}

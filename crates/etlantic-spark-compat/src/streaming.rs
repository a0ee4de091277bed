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

/// Formats every Spark distribution reads; anything else comes from a connector jar.
const BUILT_IN_FORMATS: &[&str] = &["json", "csv", "parquet", "orc", "text"];

/// The connector jar Spark needs for a binding scheme, as `spark.jars.packages` names it.
fn connector_of(scheme: &str) -> Option<(&'static str, &'static str)> {
    match scheme {
        "kafka" => Some(("kafka", "org.apache.spark:spark-sql-kafka-0-10_2.13")),
        "delta" => Some(("delta", "io.delta:delta-spark_2.13")),
        _ => None,
    }
}

/// Checks, before a query starts, that the cluster reads `format`: Spark resolves the
/// data source when it analyses a read of it. A missing connector is `ETL711` naming
/// the package to add (instead of a Java stack trace when the query starts); any other
/// analysis error (a missing option, say) means the data source exists.
pub fn require_data_source(session: &SparkSession, format: &str, package: &str) -> Result<()> {
    if BUILT_IN_FORMATS.contains(&format) {
        return Ok(());
    }
    match session.read().format(format).load(None).schema() {
        Ok(_) => Ok(()),
        Err(e) => {
            let text = e.to_string();
            // SQLSTATE 42K02 is "data source not found" (conditions DATA_SOURCE_NOT_FOUND,
            // KAFKA_DATA_SOURCE_NOT_ENABLED, ...).
            let missing = [
                "42K02",
                "DATA_SOURCE_NOT_FOUND",
                "Failed to find data source",
            ]
            .iter()
            .any(|m| text.contains(m));
            if missing {
                Err(Error::new(
                    &codes::CONNECTOR_MISSING,
                    format!("the Spark cluster has no `{format}` data source"),
                )
                .with_help(format!(
                    "Add `{package}` (matching the cluster's Spark and Scala versions) to `spark.jars.packages` or the cluster's jars."
                )))
            } else {
                Ok(())
            }
        }
    }
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

/// Spark's `StreamingQueryProgress` JSON as ETLantic's progress record (the embedded
/// runtime's, which is shaped like Spark's): Spark's fields are kept, and ours are added
/// — `kind` (`data` when any source moved its offset, else `no_data`), `lateRows`
/// (Spark's `numRowsDroppedByWatermark` over its stateful operators: Spark drops late
/// rows), `quarantinedRows` (always 0: Spark quarantines nothing), `checkpointLocation`
/// and `backend: spark`.
pub fn progress_record(spark: &serde_json::Value, checkpoint: &str) -> serde_json::Value {
    use serde_json::{json, Value};
    let mut record = spark.as_object().cloned().unwrap_or_default();
    let moved = spark["sources"].as_array().is_some_and(|sources| {
        sources
            .iter()
            .any(|s| s["startOffset"] != s["endOffset"] && !s["endOffset"].is_null())
    });
    let late: u64 = spark["stateOperators"]
        .as_array()
        .map(|ops| {
            ops.iter()
                .filter_map(|o| o["numRowsDroppedByWatermark"].as_u64())
                .sum()
        })
        .unwrap_or(0);
    record.insert("kind".into(), json!(if moved { "data" } else { "no_data" }));
    record.insert("lateRows".into(), json!(late));
    record.insert("quarantinedRows".into(), json!(0));
    record.insert("checkpointLocation".into(), json!(checkpoint));
    record.insert("backend".into(), json!("spark"));
    Value::Object(record)
}

/// A running Spark streaming query of a pipeline.
pub struct SparkStreamingQuery {
    session: SparkSession,
    query: StreamingQuery,
    sink: String,
    columns: Vec<String>,
    checkpoint: String,
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
            // A connector the cluster lacks is reported before anything starts.
            if let Some((format, package)) = connector_of(&asset.scheme) {
                require_data_source(&session, format, package)?;
            }
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
            checkpoint: checkpoint.display().to_string(),
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

    /// Spark's recent progress records as ETLantic progress records
    /// ([`progress_record`]), oldest first.
    pub fn recent_progress(&self) -> Result<Vec<serde_json::Value>> {
        let records = self
            .query
            .recent_progress()
            .map_err(|e| engine("recentProgress", e))?;
        Ok(records
            .iter()
            .filter_map(|text| serde_json::from_str(text).ok())
            .map(|p| progress_record(&p, &self.checkpoint))
            .collect())
    }

    /// Spark's status of the query: its message, whether data is available, whether a
    /// trigger is active.
    pub fn status(&self) -> Result<(String, bool, bool)> {
        let s = self.query.status().map_err(|e| engine("status", e))?;
        Ok((s.status_message, s.is_data_available, s.is_trigger_active))
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spark_progress_becomes_an_etlantic_progress_record() {
        let spark = json!({
            "batchId": 3,
            "numInputRows": 2,
            "durationMs": {"walCommit": 5, "triggerExecution": 40},
            "eventTime": {"watermark": "2024-01-01T00:00:02.000Z"},
            "stateOperators": [{"numRowsTotal": 4, "numRowsDroppedByWatermark": 1}],
            "sources": [{"startOffset": {"logOffset": 1}, "endOffset": {"logOffset": 2}}],
        });
        let r = progress_record(&spark, "/tmp/ck");
        assert_eq!(r["kind"], "data");
        assert_eq!(r["lateRows"], 1);
        assert_eq!(r["quarantinedRows"], 0);
        assert_eq!(r["backend"], "spark");
        assert_eq!(r["batchId"], 3);
        assert_eq!(r["eventTime"]["watermark"], "2024-01-01T00:00:02.000Z");
        let idle = json!({
            "numInputRows": 0,
            "sources": [{"startOffset": {"logOffset": 2}, "endOffset": {"logOffset": 2}}],
        });
        assert_eq!(progress_record(&idle, "/tmp/ck")["kind"], "no_data");
    }

    #[test]
    fn schemas_become_spark_ddl() {
        use arrow::datatypes::{Field, Schema, TimeUnit};
        let schema = std::sync::Arc::new(Schema::new(vec![
            Field::new(
                "ts",
                DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
                true,
            ),
            Field::new("user`s", DataType::Utf8, true),
            Field::new("n", DataType::Int32, true),
        ]));
        assert_eq!(
            ddl(&schema).unwrap(),
            "`ts` TIMESTAMP, `user``s` STRING, `n` BIGINT"
        );
    }
}

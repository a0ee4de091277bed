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
use std::path::{Path, PathBuf};

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

/// A `file://` location Spark reads or writes: its format (Spark's name), the local
/// path (relative paths resolve against the project root), and Spark's reader/writer
/// options from the binding's parameters.
struct FileLocation {
    format: &'static str,
    path: String,
    options: Vec<(&'static str, String)>,
    max_files: Option<usize>,
}

impl FileLocation {
    fn parse(binding: &str, root: &Path) -> Result<Self> {
        let uri = BindingUri::parse(binding)?;
        if uri.scheme != "file" {
            return Err(Error::new(
                &codes::STREAMING_REGION_UNSUPPORTED,
                format!(
                    "a streaming query on Spark reads and writes file:// locations, not `{}`",
                    uri.redacted()
                ),
            ));
        }
        let extension = Path::new(uri.location.trim_end_matches('/'))
            .extension()
            .and_then(|e| e.to_str())
            .unwrap_or("")
            .to_ascii_lowercase();
        let named = uri.param("format").map(str::to_ascii_lowercase);
        let format = match named.as_deref().unwrap_or(extension.as_str()) {
            "jsonl" | "ndjson" | "json" => "json",
            "csv" => "csv",
            "parquet" => "parquet",
            other => {
                return Err(Error::new(
                    &codes::FORMAT_UNSUPPORTED,
                    format!(
                        "binding `{}`: format `{other}` is not one Spark reads here (jsonl, csv, parquet)",
                        uri.redacted()
                    ),
                )
                .with_help("Add `?format=jsonl` (or csv, parquet) to the binding."))
            }
        };
        let mut options = Vec::new();
        let mut max_files = None;
        for (key, value) in &uri.params {
            match key.as_str() {
                "format" => {}
                "header" if format == "csv" => options.push(("header", value.clone())),
                "delimiter" | "sep" if format == "csv" => options.push((
                    "sep",
                    if matches!(value.as_str(), "tab" | "\\t") {
                        "\t".into()
                    } else {
                        value.clone()
                    },
                )),
                "max_files_per_trigger" | "maxFilesPerTrigger" => {
                    max_files = value.parse().ok().filter(|n| *n > 0);
                }
                _ => {}
            }
        }
        if format == "csv" && !options.iter().any(|(k, _)| *k == "header") {
            // ETLantic's CSV files have a header line unless the binding says otherwise.
            options.push(("header", "true".into()));
        }
        let path = etlantic_core::uri::located(root, &uri.location)
            .display()
            .to_string();
        Ok(FileLocation {
            format,
            path,
            options,
            max_files,
        })
    }
}

/// A batch read of the files at `at` with the DDL schema `schema`.
fn read_files(session: &SparkSession, at: &FileLocation, schema: &str) -> spark_connect::DataFrame {
    let mut r = session.read().format(at.format).schema(schema.to_string());
    for (k, v) in &at.options {
        r = r.option(k, v);
    }
    r.load(Some(&at.path))
}

/// What Spark's file sink committed at the `file://` binding `binding` (relative paths
/// against `root`), read as `schema` through the Spark Connect endpoint `url`: Spark
/// reads only the files its sink's `_spark_metadata` log lists, never a file of a
/// micro-batch that did not commit.
pub fn read_file_sink(
    url: &str,
    binding: &str,
    root: &Path,
    schema: &SchemaRef,
) -> Result<Vec<RecordBatch>> {
    let session = connect(url)?;
    let at = FileLocation::parse(binding, root)?;
    let columns = schema
        .fields()
        .iter()
        .map(|f| spark_connect::functions::col(f.name()));
    read_files(&session, &at, &ddl(schema)?)
        .select(columns)
        .collect_record_batches()
        .map_err(|e| engine("reading the sink", e))
}

/// How the query's sink is written.
#[derive(Clone, Debug)]
pub enum SparkSink {
    /// Spark's memory sink under this query name (tests, conformance):
    /// [`SparkStreamingQuery::sink_rows`] reads it back.
    Memory(String),
    /// The pipeline's sink binding (a `file://` directory), through Spark's file sink:
    /// exactly once by its `_spark_metadata` log, append mode only.
    Binding,
}

/// How a pipeline's streaming query runs on Spark.
#[derive(Clone, Debug)]
pub struct SparkQueryOptions {
    /// The Spark Connect endpoint (`sc://host:port`).
    pub url: String,
    /// The project root: relative file locations resolve against it.
    pub root: PathBuf,
    /// Spark's checkpoint location for the query (a path the cluster reaches).
    pub checkpoint: PathBuf,
    /// Where the result goes.
    pub sink: SparkSink,
    /// When micro-batches run (a continuous trigger runs as processing-time batches at
    /// its interval; the planner warns with `ETL405`).
    pub trigger: etlantic_core::streaming::Trigger,
    /// Files per micro-batch for streaming sources whose pipeline declares no
    /// `read_limit.max_files` (Spark's `maxFilesPerTrigger`); `None` reads all new files.
    pub default_max_files: Option<usize>,
    /// Read with Spark's `FAILFAST` mode and fail on a null required field (a pipeline
    /// with `on_error: fail`); otherwise Spark's `PERMISSIVE` default nulls bad values.
    pub fail_on_bad_records: bool,
}

fn spark_trigger(t: etlantic_core::streaming::Trigger) -> Trigger {
    use etlantic_core::streaming::Trigger as T;
    match t {
        T::AvailableNow => Trigger::AvailableNow,
        T::Once => Trigger::Once,
        T::ProcessingTime(d) | T::Continuous(d) => {
            Trigger::ProcessingTime(format!("{} milliseconds", d.as_millis()))
        }
    }
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

/// The error of a failed query: bad records (Spark's `FAILFAST` reader fails the read
/// of the file that holds one, `FAILED_READ_FILE`; the required-field assertion names
/// `ETL703`) are `ETL705`, anything else `ETL707`; Spark's message keeps its cause.
fn failure_of(message: &str) -> Error {
    let first_line = message.lines().next().unwrap_or(message);
    // `[STREAM_FAILED] Query [id = ..., runId = ...] terminated with exception: <cause>`
    let cause = first_line
        .split_once("terminated with exception: ")
        .map(|(_, c)| c)
        .unwrap_or(first_line)
        .trim();
    let bad = ["MALFORMED_RECORD", "FAILED_READ_FILE", "ETL703"]
        .iter()
        .any(|m| message.contains(m));
    if bad {
        Error::new(
            &codes::BAD_RECORDS_FAIL,
            format!("the Spark query stopped at a bad record: {cause}"),
        )
        .with_help("A streaming query on Spark runs with `on_error: fail`: Spark reads in FAILFAST mode, so a malformed record (or a missing required field) in the file named stops it. Fix the record and run again; the checkpoint resumes at that file.")
    } else {
        engine("the query failed", cause)
    }
}

/// A running Spark streaming query of a pipeline.
pub struct SparkStreamingQuery {
    session: SparkSession,
    query: StreamingQuery,
    /// The memory sink's table (empty for a binding sink).
    sink: String,
    /// A binding sink's location and the schema it is read back as.
    sink_files: Option<(FileLocation, String)>,
    columns: Vec<String>,
    checkpoint: String,
    /// Source id → the path Spark reads, to name Spark's sources in progress records.
    source_paths: Vec<(String, String)>,
}

impl SparkStreamingQuery {
    /// Compiles the streaming pipeline `plan` and starts it at the Spark Connect
    /// endpoint `url`, its sink a memory table named `sink_table`, one new file per
    /// source and micro-batch, at a processing-time trigger (the way the conformance
    /// corpus drives Spark). Relative file locations resolve against `root`.
    pub fn start(
        plan: &PipelinePlan,
        url: &str,
        root: &Path,
        checkpoint: &Path,
        sink_table: &str,
        trigger_interval_ms: u64,
    ) -> Result<Self> {
        Self::start_with(
            plan,
            &SparkQueryOptions {
                url: url.to_string(),
                root: root.to_path_buf(),
                checkpoint: checkpoint.to_path_buf(),
                sink: SparkSink::Memory(sink_table.to_string()),
                trigger: etlantic_core::streaming::Trigger::ProcessingTime(
                    etlantic_core::streaming::Duration::from_millis(
                        i64::try_from(trigger_interval_ms).unwrap_or(i64::MAX),
                    ),
                ),
                default_max_files: Some(1),
                fail_on_bad_records: false,
            },
        )
    }

    /// Compiles the streaming pipeline `plan` and starts it as one Spark Structured
    /// Streaming query as `options` say. Spark's refusal of the query (an output mode
    /// it does not support for the operators, say) is an `ETL707` error here; a sink
    /// Spark's file sink cannot write in the pipeline's output mode is `ETL504`.
    pub fn start_with(plan: &PipelinePlan, options: &SparkQueryOptions) -> Result<Self> {
        let session = connect(&options.url)?;
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
        let mut source_paths = Vec::new();
        for s in &plan.sources {
            let asset = plan.assets.get(&s.asset).ok_or_else(|| {
                Error::new(&codes::PLAN_INVALID, format!("no asset `{}`", s.asset))
            })?;
            let schema = plan.asset_contract(&s.asset)?.arrow_schema();
            // A connector the cluster lacks is reported before anything starts.
            if let Some((format, package)) = connector_of(&asset.scheme) {
                require_data_source(&session, format, package)?;
            }
            let at = FileLocation::parse(&asset.binding, &options.root)?;
            source_paths.push((s.id.clone(), at.path.clone()));
            let mut reader_options: Vec<(&str, String)> = at.options.clone();
            if options.fail_on_bad_records && at.format != "parquet" {
                reader_options.push(("mode", "FAILFAST".into()));
            }
            let df = if s.static_refresh.is_some() {
                let mut r = session.read().schema(ddl(&schema)?).format(at.format);
                for (k, v) in &reader_options {
                    r = r.option(k, v);
                }
                r.load(Some(&at.path))
            } else {
                let mut r = session
                    .read_stream()
                    .format(at.format)
                    .schema(ddl(&schema)?);
                let max_files = s
                    .read_limit
                    .as_ref()
                    .and_then(|l| l.max_files)
                    .or(at.max_files)
                    .or(options.default_max_files);
                if let Some(n) = max_files {
                    r = r.option("maxFilesPerTrigger", &n.to_string());
                }
                for (k, v) in &reader_options {
                    r = r.option(k, v);
                }
                r.load(Some(&at.path))
            };
            // A required field that is null stops the query (`on_error: fail`):
            // `assert_true` is null when it holds and raises otherwise.
            let required: Vec<String> = schema
                .fields()
                .iter()
                .filter(|f| !f.is_nullable())
                .map(|f| format!("{} IS NOT NULL", ident(f.name())))
                .collect();
            let df = if options.fail_on_bad_records && !required.is_empty() {
                df.filter(spark_connect::functions::expr(&format!(
                    "assert_true({}, 'ETL703: source `{}` has a record without a required field') IS NULL",
                    required.join(" AND "),
                    s.id.replace('\'', "")
                )))
            } else {
                df
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
        let writer = out
            .write_stream()
            .output_mode(output_mode(sink.output_mode))
            .trigger(spark_trigger(options.trigger))
            .option(
                "checkpointLocation",
                &options.checkpoint.display().to_string(),
            );
        let mut sink_files = None;
        let (query, memory) = match &options.sink {
            SparkSink::Memory(table) => (
                writer.format("memory").query_name(table).start(""),
                table.clone(),
            ),
            SparkSink::Binding => {
                let asset = plan.assets.get(&sink.asset).ok_or_else(|| {
                    Error::new(&codes::PLAN_INVALID, format!("no asset `{}`", sink.asset))
                })?;
                let at = FileLocation::parse(&asset.binding, &options.root)?;
                if sink.output_mode != OutputMode::Append {
                    return Err(Error::new(
                        &codes::SINK_MODE_UNSUPPORTED,
                        format!(
                            "sink `{}`: Spark's file sink writes append mode only, not {}",
                            sink.id,
                            output_mode(sink.output_mode)
                        ),
                    )
                    .with_help("Use `output_mode: append` (windows are written once the watermark closes them)."));
                }
                let mut w = writer.format(at.format);
                for (k, v) in &at.options {
                    w = w.option(k, v);
                }
                if at.format == "json" || at.format == "csv" {
                    // ETLantic's text formats: every key written, UTC timestamps with
                    // milliseconds.
                    w = w
                        .option("ignoreNullFields", "false")
                        .option("timeZone", "UTC")
                        .option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSXXX");
                }
                let started = w.start(&at.path);
                let schema = ddl(&plan.asset_contract(&sink.asset)?.arrow_schema())?;
                sink_files = Some((at, schema));
                (started, String::new())
            }
        };
        let query = query.map_err(|e| engine("starting the query", e))?;
        Ok(SparkStreamingQuery {
            session,
            query,
            sink: memory,
            sink_files,
            columns,
            checkpoint: options.checkpoint.display().to_string(),
            source_paths,
        })
    }

    /// Spark's run id of the query (a new one per start, like ETLantic's).
    pub fn run_id(&self) -> &str {
        self.query.run_id()
    }

    /// Blocks until every file available now has been processed (Spark's
    /// `processAllAvailable`).
    pub fn process_all_available(&self) -> Result<()> {
        self.query
            .process_all_available()
            .map_err(|e| engine("processAllAvailable", e))
    }

    /// Everything the sink holds, as Arrow: the memory sink's rows (append/update:
    /// every row emitted so far in emission order; complete: the last result table),
    /// or what Spark's file sink committed, read back through Spark (which reads only
    /// the files its `_spark_metadata` log lists).
    pub fn sink_rows(&self) -> Result<Vec<RecordBatch>> {
        let cols = self
            .columns
            .iter()
            .map(|c| ident(c))
            .collect::<Vec<_>>()
            .join(", ");
        let df = match &self.sink_files {
            None => self
                .session
                .sql(&format!("SELECT {cols} FROM {}", ident(&self.sink)))
                .map_err(|e| engine("reading the memory sink", e))?,
            Some((at, schema)) => read_files(&self.session, at, schema).select(
                self.columns
                    .iter()
                    .map(|c| spark_connect::functions::col(c)),
            ),
        };
        df.collect_record_batches()
            .map_err(|e| engine("reading the sink", e))
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
    /// ([`progress_record`]), oldest first. A source's `description` starts with the
    /// pipeline's source id (`clicks FileStreamSource[file:/...]`).
    pub fn recent_progress(&self) -> Result<Vec<serde_json::Value>> {
        let records = self
            .query
            .recent_progress()
            .map_err(|e| engine("recentProgress", e))?;
        Ok(records
            .iter()
            .filter_map(|text| serde_json::from_str(text).ok())
            .map(|p| self.record(&p))
            .collect())
    }

    fn record(&self, spark: &serde_json::Value) -> serde_json::Value {
        let mut r = progress_record(spark, &self.checkpoint);
        for source in r["sources"].as_array_mut().into_iter().flatten() {
            let description = source["description"].as_str().unwrap_or("").to_string();
            // Spark names a file source by its path (`file:/abs/dir`).
            let id = self.source_paths.iter().find(|(_, path)| {
                description
                    .trim_end_matches(']')
                    .trim_end_matches('/')
                    .ends_with(path.trim_end_matches('/'))
            });
            if let Some((id, _)) = id {
                source["description"] = serde_json::json!(format!("{id} {description}"));
                source["sourceId"] = serde_json::json!(id);
            }
        }
        r
    }

    /// Runs the query until it ends by itself (`available_now`, `once`), `stop` is set,
    /// or `max_batches` micro-batches (with data or without) have run; every new
    /// progress record goes to `on_progress` as it appears. Spark runs the query on its
    /// own schedule and this polls it five times a second, so a processing-time trigger
    /// shorter than that may run one micro-batch more before the query stops. A query that fails is an error: `ETL705` when
    /// Spark's reader met a malformed record or a required field was null (the
    /// pipeline runs with `on_error: fail`), else `ETL707` with Spark's message.
    pub fn drive(
        &self,
        stop: &std::sync::atomic::AtomicBool,
        max_batches: Option<u64>,
        on_progress: &dyn Fn(&serde_json::Value),
    ) -> Result<()> {
        // (the next batch id to deliver, micro-batches run so far)
        let mut seen: (i64, u64) = (0, 0);
        let deliver = |seen: &mut (i64, u64)| -> Result<()> {
            for r in self.recent_progress()? {
                let id = r["batchId"].as_i64().unwrap_or(-1);
                if id < seen.0 {
                    continue;
                }
                seen.0 = id + 1;
                seen.1 += 1;
                on_progress(&r);
            }
            Ok(())
        };
        loop {
            let ended = self
                .query
                .await_termination(Some(0.2))
                .map_err(|e| self.failure(e))?;
            deliver(&mut seen)?;
            if let Some(e) = self.query.exception().map_err(|e| engine("exception", e))? {
                return Err(failure_of(&format!("{} {}", e.error_class, e.message)));
            }
            if ended == Some(true) {
                return Ok(());
            }
            let reached = max_batches.is_some_and(|n| seen.1 >= n);
            if reached || stop.load(std::sync::atomic::Ordering::Relaxed) {
                self.stop()?;
                return deliver(&mut seen);
            }
        }
    }

    fn failure(&self, e: impl std::fmt::Display) -> Error {
        failure_of(&e.to_string())
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

    /// A record as Spark 4 writes it reads as a typed progress record, keeping the
    /// members ETLantic has no field for.
    #[test]
    fn a_full_spark_record_reads_as_a_typed_progress_record() {
        let spark = json!({
            "id": "7b0c1f2e-0000-4000-8000-000000000001",
            "runId": "7b0c1f2e-0000-4000-8000-000000000002",
            "name": null,
            "timestamp": "2024-01-01T00:00:05.000Z",
            "batchId": 1,
            "batchDuration": 412,
            "numInputRows": 6,
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": 14.56,
            "durationMs": {"addBatch": 300, "getBatch": 2, "latestOffset": 10,
                           "queryPlanning": 20, "triggerExecution": 412, "walCommit": 30},
            "eventTime": {"avg": "2024-01-01T00:00:03.000Z", "max": "2024-01-01T00:00:04.000Z",
                          "min": "2024-01-01T00:00:01.000Z", "watermark": "1970-01-01T00:00:00.000Z"},
            "stateOperators": [{
                "operatorName": "stateStoreSave", "numRowsTotal": 2, "numRowsUpdated": 2,
                "allUpdatesTimeMs": 40, "numRowsRemoved": 0, "allRemovalsTimeMs": 0,
                "commitTimeMs": 60, "memoryUsedBytes": 1024, "numRowsDroppedByWatermark": 0,
                "numShufflePartitions": 1, "numStateStoreInstances": 1,
                "customMetrics": {"SnapshotLastUploaded.partition_0_default": -1,
                                  "loadedMapCacheHitCount": 0, "loadedMapCacheMissCount": 0,
                                  "stateOnCurrentVersionSizeBytes": 500}
            }],
            "sources": [{
                "description": "FileStreamSource[file:/tmp/in]",
                "startOffset": null, "endOffset": {"logOffset": 0},
                "latestOffset": null, "numInputRows": 6,
                "inputRowsPerSecond": 0.0, "processedRowsPerSecond": 14.56,
                "metrics": {}
            }],
            "sink": {"description": "FileSink[file:/tmp/out]", "numOutputRows": -1, "metrics": {}},
            "observedMetrics": {}
        });
        let mut r = progress_record(&spark, "/tmp/ck");
        r["sources"][0]["sourceId"] = json!("clicks");
        let p = etlantic_runtime::progress::QueryProgress::from_json(&r).unwrap();
        assert_eq!(
            (p.batch_id, p.num_input_rows, p.sink.num_output_rows),
            (1, 6, -1)
        );
        assert_eq!(p.source("clicks").map(|s| s.num_input_rows), Some(6));
        assert_eq!(
            p.state_operators[0].custom_metrics["stateOnCurrentVersionSizeBytes"],
            500
        );
        assert_eq!(p.extra["backend"], "spark");
        assert_eq!(p.to_json()["stateOperators"][0]["commitTimeMs"], 60);
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

//! OpenLineage run events of a pipeline run, sent where the profile's `lineage` says
//! (`file://` appends JSON lines, `http(s)://` POSTs each event, as Marquez's
//! `/api/v1/lineage` takes them).
//!
//! A run sends `START` when its query has started, `RUNNING` after a micro-batch at most
//! every `running_interval`, and one of `COMPLETE` (the run finished its work: a batch
//! run, an available-now or once trigger, `max_batches`), `ABORT` (stopped on request)
//! or `FAIL`. Every event names the job (the pipeline, in the profile's namespace), the
//! run (the run id), the input datasets (the sources' bindings) with their contract
//! schemas, and the output datasets (the sinks' bindings) with their schemas and column
//! lineage; events after `START` add row counts so far and the contract's quality rules
//! as data-quality assertions on the inputs. A custom run facet `etlantic` carries the
//! application, query and run ids, the plan fingerprint, the last micro-batch and the
//! quarantined records by code.
//!
//! Sending never fails or slows a run: events go through a queue to a task of their own,
//! and a failed send is logged (`tracing` warning) and counted in the run's summary.

use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::ir::column_lineage::RelationLineage;
use etlantic_core::profile::LineageConfig;
use etlantic_core::uri::BindingUri;
use etlantic_plan::plan::PipelinePlan;
use etlantic_runtime::progress::QueryProgress;
use etlantic_runtime::report::RunReport;
use etlantic_runtime::status::QueryIds;
use serde_json::{json, Map, Value};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `producer` of every event: this crate at its version.
pub const PRODUCER: &str = concat!(
    "https://github.com/etlantic/etlantic-rs/tree/v",
    env!("CARGO_PKG_VERSION")
);

/// The OpenLineage run-event schema the events follow.
pub const RUN_EVENT_SCHEMA: &str =
    "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent";

/// The schema of the custom `etlantic` run facet (shipped in `docs/openlineage/`).
pub const ETLANTIC_RUN_FACET_SCHEMA: &str =
    "https://github.com/etlantic/etlantic-rs/blob/main/docs/openlineage/EtlanticRunFacet.json";

/// The job namespace when the profile names none.
pub const DEFAULT_NAMESPACE: &str = "etlantic";

/// How long a run waits at its end for its events to be sent.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one HTTP request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(10);

/// The facet schema versions the events use (OpenLineage 1.50).
mod facet {
    pub const SCHEMA: &str =
        "https://openlineage.io/spec/facets/1-2-0/SchemaDatasetFacet.json#/$defs/SchemaDatasetFacet";
    pub const COLUMN_LINEAGE: &str = "https://openlineage.io/spec/facets/1-2-0/ColumnLineageDatasetFacet.json#/$defs/ColumnLineageDatasetFacet";
    pub const JOB_TYPE: &str =
        "https://openlineage.io/spec/facets/2-0-3/JobTypeJobFacet.json#/$defs/JobTypeJobFacet";
    pub const PROCESSING_ENGINE: &str = "https://openlineage.io/spec/facets/1-1-1/ProcessingEngineRunFacet.json#/$defs/ProcessingEngineRunFacet";
    pub const ERROR_MESSAGE: &str =
        "https://openlineage.io/spec/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet";
    pub const INPUT_STATISTICS: &str = "https://openlineage.io/spec/facets/1-0-0/InputStatisticsInputDatasetFacet.json#/$defs/InputStatisticsInputDatasetFacet";
    pub const OUTPUT_STATISTICS: &str = "https://openlineage.io/spec/facets/1-0-2/OutputStatisticsOutputDatasetFacet.json#/$defs/OutputStatisticsOutputDatasetFacet";
    pub const DATA_QUALITY_ASSERTIONS: &str = "https://openlineage.io/spec/facets/1-1-0/DataQualityAssertionsDatasetFacet.json#/$defs/DataQualityAssertionsDatasetFacet";
}

/// The kind of a run event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// The run started.
    Start,
    /// The run is going on (after a micro-batch).
    Running,
    /// The run did all its work.
    Complete,
    /// The run was stopped on request before it finished.
    Abort,
    /// The run failed.
    Fail,
}

impl EventType {
    /// OpenLineage's name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Start => "START",
            EventType::Running => "RUNNING",
            EventType::Complete => "COMPLETE",
            EventType::Abort => "ABORT",
            EventType::Fail => "FAIL",
        }
    }
}

/// A dataset as OpenLineage names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetName {
    /// Where it lives: `file`, `s3://bucket`, `kafka://host:port`, `postgres://host:port`…
    pub namespace: String,
    /// What it is there: a path, a topic, `database.schema.table`…
    pub name: String,
}

/// The OpenLineage name of the dataset a binding points at, after OpenLineage's naming
/// conventions: a local path is `file` + its absolute path; an object-store location is
/// `s3://bucket` (or `gs://`, `az://`) + the key; Kafka is `kafka://<first broker>` + the
/// topic; PostgreSQL is `postgres://host:port` + `database.schema.table`. A table format
/// (`delta://`, `iceberg://`) is named by its table's location. Credentials in a binding
/// are never part of a name.
pub fn dataset_name(binding: &str, root: &Path) -> DatasetName {
    let Ok(uri) = BindingUri::parse(binding) else {
        return DatasetName {
            namespace: DEFAULT_NAMESPACE.into(),
            name: etlantic_core::uri::redact(binding),
        };
    };
    let location = uri.location.as_str();
    match uri.scheme.as_str() {
        "file" => file_name(location, root),
        "s3" | "s3a" | "gs" | "az" | "abfss" => bucket_name(&uri.scheme, location),
        "delta" => match BindingUri::parse(location) {
            Ok(inner) if inner.scheme != "file" => dataset_name(location, root),
            Ok(inner) => file_name(&inner.location, root),
            Err(_) => file_name(location, root),
        },
        "iceberg" => {
            let table = location.replace('.', "/");
            match uri.param("warehouse") {
                Some(w) if w.contains("://") && !w.starts_with("file://") => {
                    let mut d = dataset_name(w, root);
                    d.name = format!("{}/{table}", d.name.trim_end_matches('/'));
                    d
                }
                Some(w) => {
                    let w = w.strip_prefix("file://").unwrap_or(w);
                    file_name(&format!("{}/{table}", w.trim_end_matches('/')), root)
                }
                None => DatasetName {
                    namespace: "iceberg".into(),
                    name: location.to_string(),
                },
            }
        }
        "kafka" => {
            let (brokers, topic) = location.split_once('/').unwrap_or((location, ""));
            let first = brokers.split(',').next().unwrap_or_default();
            DatasetName {
                namespace: format!("kafka://{}", host_port(first)),
                name: topic.to_string(),
            }
        }
        "postgres" | "postgresql" => {
            let (server, database) = location.split_once('/').unwrap_or((location, ""));
            let table = uri.param("table").unwrap_or_default();
            let table = match table.contains('.') {
                true => table.to_string(),
                false => format!("public.{table}"),
            };
            DatasetName {
                namespace: format!("postgres://{}", host_port(server)),
                name: format!("{database}.{table}"),
            }
        }
        "sqlite" => {
            let path = file_name(location, root).name;
            DatasetName {
                namespace: format!("sqlite://{path}"),
                name: uri.param("table").unwrap_or_default().to_string(),
            }
        }
        other => DatasetName {
            namespace: other.to_string(),
            name: location.to_string(),
        },
    }
}

/// The host and port of `[user[:password]@]host[:port]`.
fn host_port(authority: &str) -> &str {
    authority.rsplit_once('@').map_or(authority, |(_, h)| h)
}

fn file_name(location: &str, root: &Path) -> DatasetName {
    let path = etlantic_core::uri::located(root, location);
    let path = etlantic_core::uri::absolute_normalized(&path).unwrap_or(path);
    DatasetName {
        namespace: "file".into(),
        name: path.to_string_lossy().into_owned(),
    }
}

fn bucket_name(scheme: &str, location: &str) -> DatasetName {
    let (bucket, key) = location.split_once('/').unwrap_or((location, ""));
    DatasetName {
        namespace: format!("{scheme}://{}", host_port(bucket)),
        name: key.to_string(),
    }
}

/// A facet: its fields with OpenLineage's `_producer` and `_schemaURL`.
fn facet(schema_url: &str, fields: Value) -> Value {
    let mut m = Map::new();
    m.insert("_producer".into(), PRODUCER.into());
    m.insert("_schemaURL".into(), schema_url.into());
    if let Value::Object(f) = fields {
        m.extend(f);
    }
    Value::Object(m)
}

/// One end of the pipeline as a dataset.
#[derive(Clone, Debug)]
struct Dataset {
    /// The source or sink id.
    node: String,
    /// The asset.
    asset: String,
    name: DatasetName,
    /// Facets sent in every event.
    facets: Value,
}

/// What a run's events say of the job and its datasets, computed once from the plan.
#[derive(Clone, Debug)]
pub struct LineageModel {
    namespace: String,
    job: String,
    processing: &'static str,
    description: Option<String>,
    fingerprint: String,
    inputs: Vec<Dataset>,
    outputs: Vec<Dataset>,
    /// Per source: its contract's quality rules (id, check, column, threshold, description).
    rules: std::collections::BTreeMap<String, Vec<etlantic_core::contract::rules::Rule>>,
    /// The profile's policies by rule id, and the default of rules that point at records.
    policies: indexmap::IndexMap<String, etlantic_core::contract::rules::Policy>,
    on_error: etlantic_core::contract::rules::Policy,
}

impl LineageModel {
    /// The model of `plan`'s runs; relative bindings resolve against `root`.
    pub fn new(plan: &PipelinePlan, root: &Path, namespace: Option<&str>) -> Self {
        let schema_facet = |asset: &str| {
            let fields: Vec<Value> = plan
                .assets
                .get(asset)
                .map(|a| {
                    a.schema
                        .iter()
                        .map(|f| json!({"name": f.name, "type": f.data_type}))
                        .collect()
                })
                .unwrap_or_default();
            facet(facet::SCHEMA, json!({ "fields": fields }))
        };
        let name_of = |asset: &str| {
            let binding = plan.assets.get(asset).map(|a| a.binding.as_str());
            dataset_name(binding.unwrap_or_default(), root)
        };
        let inputs: Vec<Dataset> = plan
            .sources
            .iter()
            .map(|s| Dataset {
                node: s.id.clone(),
                asset: s.asset.clone(),
                name: name_of(&s.asset),
                facets: json!({ "schema": schema_facet(&s.asset) }),
            })
            .collect();
        let lineage = etlantic_plan::column_lineage::sink_lineage(plan);
        let outputs = plan
            .sinks
            .iter()
            .map(|s| {
                let mut facets = json!({ "schema": schema_facet(&s.asset) });
                if let Some(l) = lineage.get(&s.id) {
                    if let Some(f) = column_lineage_facet(l, &inputs) {
                        facets["columnLineage"] = f;
                    }
                }
                Dataset {
                    node: s.id.clone(),
                    asset: s.asset.clone(),
                    name: name_of(&s.asset),
                    facets,
                }
            })
            .collect();
        let rules = plan
            .sources
            .iter()
            .filter_map(|s| {
                let contract = plan.asset_contract(&s.asset).ok()?;
                let set = etlantic_core::contract::rules::RuleSet::of(&contract).ok()?;
                Some((s.id.clone(), set.rules))
            })
            .collect();
        LineageModel {
            namespace: namespace.unwrap_or(DEFAULT_NAMESPACE).to_string(),
            job: plan.pipeline.clone(),
            processing: match plan.profile.mode {
                etlantic_core::streaming::ExecutionMode::Streaming => "STREAMING",
                _ => "BATCH",
            },
            description: plan.description.clone(),
            fingerprint: plan.fingerprint.clone(),
            inputs,
            outputs,
            rules,
            policies: plan.profile.quality_policies.clone(),
            on_error: plan.profile.on_error.as_policy(),
        }
    }

    /// A run event. `counts` (a report of the run so far, or at its end) adds row counts
    /// and quality assertions; `progress` the last micro-batch; `error` the failure.
    pub fn event(
        &self,
        kind: EventType,
        run: &RunIdentity,
        counts: Option<&RunReport>,
        progress: Option<&QueryProgress>,
        error: Option<&str>,
    ) -> Value {
        let mut run_facets = json!({
            "processing_engine": facet(facet::PROCESSING_ENGINE, json!({
                "version": env!("CARGO_PKG_VERSION"),
                "name": "ETLantic-rs",
                "openlineageAdapterVersion": env!("CARGO_PKG_VERSION"),
            })),
            "etlantic": facet(ETLANTIC_RUN_FACET_SCHEMA, self.etlantic_facet(run, progress)),
        });
        if let Some(message) = error {
            run_facets["errorMessage"] = facet(
                facet::ERROR_MESSAGE,
                json!({"message": message, "programmingLanguage": "Rust"}),
            );
        }
        let mut job_facets = json!({
            "jobType": facet(facet::JOB_TYPE, json!({
                "processingType": self.processing,
                "integration": "ETLANTIC",
                "jobType": "QUERY",
            })),
        });
        if let Some(d) = &self.description {
            job_facets["documentation"] = facet(
                "https://openlineage.io/spec/facets/1-1-0/DocumentationJobFacet.json#/$defs/DocumentationJobFacet",
                json!({"description": d}),
            );
        }
        let inputs: Vec<Value> = self
            .inputs
            .iter()
            .map(|d| {
                let mut v = dataset_json(d);
                if let Some(r) = counts {
                    v["inputFacets"] = self.input_facets(d, r);
                }
                v
            })
            .collect();
        let outputs: Vec<Value> = self
            .outputs
            .iter()
            .map(|d| {
                let mut v = dataset_json(d);
                let rows = counts.and_then(|r| r.sinks.iter().find(|s| s.id == d.node));
                if let Some(s) = rows.filter(|s| !s.rows_unknown) {
                    v["outputFacets"] = json!({
                        "outputStatistics": facet(facet::OUTPUT_STATISTICS, json!({"rowCount": s.rows})),
                    });
                }
                v
            })
            .collect();
        json!({
            "eventType": kind.as_str(),
            "eventTime": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
            "producer": PRODUCER,
            "schemaURL": RUN_EVENT_SCHEMA,
            "run": {"runId": run.run_id, "facets": run_facets},
            "job": {"namespace": self.namespace, "name": self.job, "facets": job_facets},
            "inputs": inputs,
            "outputs": outputs,
        })
    }

    fn etlantic_facet(&self, run: &RunIdentity, progress: Option<&QueryProgress>) -> Value {
        let mut f = json!({
            "applicationId": run.ids.application_id,
            "queryId": run.ids.query_id,
            "runId": run.ids.run_id,
            "planFingerprint": self.fingerprint,
        });
        if let Some(p) = progress {
            f["batchId"] = json!(p.batch_id);
            if let Some(w) = &p.event_time.watermark {
                f["watermark"] = json!(w);
            }
            f["quarantinedByCode"] = json!(p.quarantined_by_code);
        }
        f
    }

    /// An input's row count and its contract's quality rules as assertions: one per rule
    /// (passed when it found no violation), and one for the records quarantined because
    /// they did not fit the contract at all.
    fn input_facets(&self, d: &Dataset, r: &RunReport) -> Value {
        let source = r.sources.iter().find(|s| s.id == d.node);
        let mut assertions = Vec::new();
        if let Some(s) = source {
            assertions.push(json!({
                "assertion": "contract",
                "name": format!("{}.contract", d.asset),
                "success": s.rejected == 0,
                "severity": "warn",
                "description": "records that did not fit the contract were quarantined",
                "expected": "0",
                "actual": s.rejected.to_string(),
            }));
        }
        let on_error = self.on_error;
        for rule in self.rules.get(&d.node).into_iter().flatten() {
            let mut a = json!({
                "assertion": rule.check.name(),
                "name": rule.id,
                "expected": rule.threshold.describe(),
            });
            if let Some(c) = &rule.field {
                a["column"] = json!(c);
            }
            if let Some(t) = &rule.description {
                a["description"] = json!(t);
            }
            // A batch rule is judged by the quality gate (its outcome in the report); a
            // record rule by the decoder, whose rejections are counted by rule.
            let judged = r
                .quality
                .iter()
                .find(|q| q.asset == d.asset && q.id == rule.id);
            let (violations, policy, removed, failed) = match judged {
                Some(q) => (q.violations, q.policy, q.removed, q.failed > 0),
                None => {
                    let n = source
                        .and_then(|s| s.quarantined_by_rule.get(&rule.id))
                        .copied()
                        .unwrap_or(0);
                    let policy = rule.policy(self.policies.get(&rule.id).copied(), on_error);
                    (n, policy, n, n > 0)
                }
            };
            a["success"] = json!(violations == 0 && !failed);
            a["severity"] = json!(match policy {
                etlantic_core::contract::rules::Policy::Fail => "error",
                _ => "warn",
            });
            a["actual"] = json!(violations.to_string());
            a["params"] = json!({"policy": policy.as_str(), "removed": removed});
            assertions.push(a);
        }
        let mut f = json!({
            "dataQualityAssertions": facet(
                facet::DATA_QUALITY_ASSERTIONS,
                json!({ "assertions": assertions }),
            ),
        });
        if let Some(s) = source {
            f["inputStatistics"] = facet(
                facet::INPUT_STATISTICS,
                json!({"rowCount": s.rows + s.rejected}),
            );
        }
        f
    }
}

fn dataset_json(d: &Dataset) -> Value {
    json!({"namespace": d.name.namespace, "name": d.name.name, "facets": d.facets})
}

/// The column-lineage facet of a sink: each column with a known lineage, and the columns
/// that decide its rows. `None` when nothing is known.
fn column_lineage_facet(l: &RelationLineage, inputs: &[Dataset]) -> Option<Value> {
    let dataset_of = |source: &str| inputs.iter().find(|d| d.node == source).map(|d| &d.name);
    let mut fields = Map::new();
    for (column, origins) in &l.columns {
        let inputs: Vec<Value> = origins
            .iter()
            .filter_map(|(o, how)| {
                let d = dataset_of(&o.relation)?;
                Some(json!({
                    "namespace": d.namespace, "name": d.name, "field": o.column,
                    "transformations": [{"type": "DIRECT", "subtype": how.subtype()}],
                }))
            })
            .collect();
        fields.insert(column.clone(), json!({ "inputFields": inputs }));
    }
    let dataset: Vec<Value> = l
        .rows
        .iter()
        .filter_map(|(o, hows)| {
            let d = dataset_of(&o.relation)?;
            let t: Vec<Value> = hows
                .iter()
                .map(|h| json!({"type": "INDIRECT", "subtype": h.subtype()}))
                .collect();
            Some(json!({"namespace": d.namespace, "name": d.name, "field": o.column, "transformations": t}))
        })
        .collect();
    if fields.is_empty() && dataset.is_empty() {
        return None;
    }
    Some(facet(
        facet::COLUMN_LINEAGE,
        json!({"fields": fields, "dataset": dataset}),
    ))
}

/// A run as its events name it.
#[derive(Clone, Debug)]
pub struct RunIdentity {
    /// The OpenLineage run id (a UUID): the query's run id.
    pub run_id: String,
    /// The ETLantic ids.
    pub ids: QueryIds,
}

/// Where events go.
#[derive(Clone, Debug)]
enum Transport {
    /// Appended to a local file, one JSON document per line.
    File(PathBuf),
    /// POSTed, one event per request.
    Http {
        url: String,
        api_key: Option<String>,
        client: reqwest::Client,
    },
}

impl Transport {
    /// The transport of `config`: `url` and `api_key` with their secrets resolved.
    fn new(url: &str, api_key: Option<String>, root: &Path) -> Result<Self> {
        let bad = |why: &str| {
            Error::new(
                &codes::BAD_URI,
                format!("lineage url `{}` {why}", etlantic_core::uri::redact(url)),
            )
            .with_help("Use `file://PATH` (JSON lines) or `http(s)://HOST/api/v1/lineage`.")
        };
        if let Some(path) = url.strip_prefix("file://") {
            if path.is_empty() {
                return Err(bad("names no file"));
            }
            return Ok(Transport::File(etlantic_core::uri::located(root, path)));
        }
        if url.starts_with("http://") || url.starts_with("https://") {
            let client = reqwest::Client::builder()
                .timeout(HTTP_TIMEOUT)
                .build()
                .map_err(|e| bad(&format!("cannot be reached: {e}")))?;
            return Ok(Transport::Http {
                url: url.to_string(),
                api_key,
                client,
            });
        }
        Err(bad("is neither file:// nor http(s)://"))
    }

    async fn send(&self, event: &Value) -> std::result::Result<(), String> {
        match self {
            Transport::File(path) => {
                use tokio::io::AsyncWriteExt;
                if let Some(dir) = path.parent() {
                    tokio::fs::create_dir_all(dir)
                        .await
                        .map_err(|e| e.to_string())?;
                }
                let mut line = serde_json::to_vec(event).map_err(|e| e.to_string())?;
                line.push(b'\n');
                let mut f = tokio::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .await
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                f.write_all(&line).await.map_err(|e| e.to_string())?;
                f.flush().await.map_err(|e| e.to_string())
            }
            Transport::Http {
                url,
                api_key,
                client,
            } => {
                let mut req = client.post(url).json(event);
                if let Some(k) = api_key {
                    req = req.bearer_auth(k);
                }
                let resp = req.send().await.map_err(|e| e.without_url().to_string())?;
                match resp.status().is_success() {
                    true => Ok(()),
                    false => Err(format!("HTTP {}", resp.status())),
                }
            }
        }
    }
}

/// What a run's lineage sending did, for its summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sent {
    /// Events delivered.
    pub delivered: u64,
    /// Events that could not be delivered.
    pub failed: u64,
}

/// The events of one run: built from the model, sent in order by a task of their own.
pub struct LineageRun {
    model: LineageModel,
    /// Taken at `finish`: events after it are dropped.
    queue: Mutex<Option<tokio::sync::mpsc::UnboundedSender<Value>>>,
    sender: Mutex<Option<tokio::task::JoinHandle<Sent>>>,
    running_interval: Duration,
    state: Mutex<RunState>,
}

struct RunState {
    run: Option<RunIdentity>,
    last_running: Option<Instant>,
    last_progress: Option<QueryProgress>,
}

impl LineageRun {
    /// Starts sending `plan`'s run events as `config` says; `resolve` resolves secret
    /// references in the URL and API key. Must be called inside a tokio runtime.
    pub fn new(
        plan: &PipelinePlan,
        config: &LineageConfig,
        root: &Path,
        resolve: &dyn Fn(&str) -> Result<String>,
    ) -> Result<Self> {
        let url = resolve(&config.url)?;
        let api_key = config.api_key.as_deref().map(resolve).transpose()?;
        let transport = Transport::new(&url, api_key, root)?;
        let (queue, mut rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
        let sender = tokio::spawn(async move {
            let mut sent = Sent::default();
            while let Some(event) = rx.recv().await {
                match transport.send(&event).await {
                    Ok(()) => sent.delivered += 1,
                    Err(e) => {
                        sent.failed += 1;
                        tracing::warn!(
                            event = event["eventType"].as_str().unwrap_or_default(),
                            "cannot send an OpenLineage event: {e}"
                        );
                    }
                }
            }
            sent
        });
        Ok(LineageRun {
            model: LineageModel::new(
                plan,
                root,
                config
                    .namespace
                    .as_deref()
                    .or(plan.profile.application_id.as_deref()),
            ),
            queue: Mutex::new(Some(queue)),
            sender: Mutex::new(Some(sender)),
            running_interval: config
                .running_interval
                .map(|d| Duration::from_millis(d.as_millis().max(0) as u64))
                .unwrap_or(DEFAULT_RUNNING_INTERVAL),
            state: Mutex::new(RunState {
                run: None,
                last_running: None,
                last_progress: None,
            }),
        })
    }

    fn send(&self, event: Value) {
        if let Some(q) = self.queue.lock().ok().as_ref().and_then(|q| q.as_ref()) {
            // The receiver lives until the queue is closed: this cannot fail.
            let _ = q.send(event);
        }
    }

    /// Sends `START` for the run `ids` names (once: a run has one start).
    pub fn started(&self, ids: &QueryIds) {
        let Ok(mut s) = self.state.lock() else { return };
        if s.run.is_some() {
            return;
        }
        let run = RunIdentity {
            run_id: ids.run_id.clone(),
            ids: ids.clone(),
        };
        self.send(self.model.event(EventType::Start, &run, None, None, None));
        s.run = Some(run);
        s.last_running = Some(Instant::now());
    }

    /// After a micro-batch: sends `RUNNING` when `running_interval` has passed since the
    /// last event, with the run's counts so far (`counts`).
    pub fn progressed(&self, p: &QueryProgress, counts: impl FnOnce() -> RunReport) {
        let Ok(mut s) = self.state.lock() else { return };
        s.last_progress = Some(p.clone());
        if s.run.is_none() {
            // A query run whole by another system: known by its first record.
            let ids = QueryIds {
                application_id: p.application_id.clone(),
                query_id: p.id.clone(),
                run_id: p.run_id.clone(),
            };
            drop(s);
            self.started(&ids);
            let Ok(s2) = self.state.lock() else { return };
            s = s2;
        }
        let due = s
            .last_running
            .is_none_or(|t| t.elapsed() >= self.running_interval);
        if !due {
            return;
        }
        s.last_running = Some(Instant::now());
        if let Some(run) = &s.run {
            let counts = counts();
            self.send(
                self.model
                    .event(EventType::Running, run, Some(&counts), Some(p), None),
            );
        }
    }

    /// Sends the run's last event — `FAIL` when `report` failed, `ABORT` when it stopped
    /// on request, else `COMPLETE` — and waits (at most 10 s) for every event to be sent.
    pub async fn finish(&self, report: &RunReport, stopped_on_request: bool) -> Sent {
        let (run, progress) = match self.state.lock() {
            Ok(mut s) => (s.run.take(), s.last_progress.take()),
            Err(_) => (None, None),
        };
        let run = match run {
            Some(r) => r,
            // It failed before it started: a run of its own, started and failed.
            None => {
                let ids = QueryIds {
                    application_id: report.application_id.clone(),
                    query_id: report.query_id.clone(),
                    run_id: match uuid::Uuid::parse_str(&report.run_id) {
                        Ok(_) => report.run_id.clone(),
                        Err(_) => uuid::Uuid::new_v4().to_string(),
                    },
                };
                let run = RunIdentity {
                    run_id: ids.run_id.clone(),
                    ids,
                };
                self.send(self.model.event(EventType::Start, &run, None, None, None));
                run
            }
        };
        let failed = report.status == "failed";
        let (kind, error) = match (failed, stopped_on_request) {
            (true, _) => {
                let message = report
                    .errors
                    .iter()
                    .map(|d| format!("{}: {}", d.code, d.message))
                    .collect::<Vec<_>>()
                    .join("\n");
                (EventType::Fail, Some(message))
            }
            (false, true) => (EventType::Abort, None),
            (false, false) => (EventType::Complete, None),
        };
        self.send(self.model.event(
            kind,
            &run,
            Some(report),
            progress.as_ref(),
            error.as_deref(),
        ));
        // Closing the queue ends the sending task once it has sent what is queued.
        if let Ok(mut q) = self.queue.lock() {
            q.take();
        }
        let Some(sender) = self.sender.lock().ok().and_then(|mut s| s.take()) else {
            return Sent::default();
        };
        match tokio::time::timeout(FLUSH_TIMEOUT, sender).await {
            Ok(Ok(sent)) => sent,
            _ => {
                tracing::warn!("OpenLineage events were still being sent when the run ended");
                Sent::default()
            }
        }
    }
}

/// The least time between two `RUNNING` events by default.
pub const DEFAULT_RUNNING_INTERVAL: Duration = Duration::from_secs(60);

/// Shared by a run and its progress listener.
pub type SharedLineage = Arc<LineageRun>;

#[cfg(test)]
mod tests {
    use super::*;

    fn name(binding: &str) -> (String, String) {
        let d = dataset_name(binding, Path::new("/proj"));
        (d.namespace, d.name)
    }

    fn pair(ns: &str, n: &str) -> (String, String) {
        (ns.to_string(), n.to_string())
    }

    #[test]
    fn datasets_are_named_after_openlineage_conventions() {
        assert_eq!(
            name("file://data/orders.jsonl"),
            pair("file", "/proj/data/orders.jsonl")
        );
        assert_eq!(
            name("file:///abs/in/?format=jsonl"),
            pair("file", "/abs/in")
        );
        assert_eq!(
            name("s3://bucket/in/clicks/?format=jsonl"),
            pair("s3://bucket", "in/clicks/")
        );
        assert_eq!(
            name("kafka://broker1:9092,broker2:9092/clicks?format=json"),
            pair("kafka://broker1:9092", "clicks")
        );
        // Credentials, even as references, are not part of a name.
        assert_eq!(
            name("postgres://etl:${secret:pg}@db:5432/warehouse?table=analytics.counts"),
            pair("postgres://db:5432", "warehouse.analytics.counts")
        );
        assert_eq!(
            name("postgres://etl@db:5432/warehouse?table=campaigns"),
            pair("postgres://db:5432", "warehouse.public.campaigns")
        );
        assert_eq!(
            name("sqlite://lake/app.db?table=counts"),
            pair("sqlite:///proj/lake/app.db", "counts")
        );
        assert_eq!(
            name("delta://lake/counts?mode=merge"),
            pair("file", "/proj/lake/counts")
        );
        assert_eq!(
            name("delta://s3://bucket/tables/counts"),
            pair("s3://bucket", "tables/counts")
        );
        assert_eq!(
            name("iceberg://analytics/counts?catalog=sqlite://lake/catalog.db&warehouse=lake/warehouse"),
            pair("file", "/proj/lake/warehouse/analytics/counts")
        );
        assert_eq!(
            name("iceberg://db/counts?warehouse=s3://bucket/wh"),
            pair("s3://bucket", "wh/db/counts")
        );
        assert_eq!(name("memory://results"), pair("memory", "results"));
    }

    #[test]
    fn event_types_are_openlineage_names() {
        let all = [
            EventType::Start,
            EventType::Running,
            EventType::Complete,
            EventType::Abort,
            EventType::Fail,
        ];
        let names: Vec<&str> = all.iter().map(|e| e.as_str()).collect();
        assert_eq!(names, ["START", "RUNNING", "COMPLETE", "ABORT", "FAIL"]);
    }
}

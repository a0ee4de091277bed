//! Prometheus metrics of a running query (`etlantic run --metrics-addr ADDR`): the
//! figures of its progress records as counters, gauges and histograms, encoded in
//! Prometheus' text format by `prometheus-client` (the Prometheus project's Rust client)
//! and served at `http://ADDR/metrics` while the query runs.
//!
//! Every series is labelled with the application and the query; per-source, per-sink,
//! per-operator and per-code series add `source`, `sink`, `operator` or `code`. The run id
//! is a label of `etlantic_run_info` only, so a restart does not start new series.

use etlantic_runtime::progress::QueryProgress;
use etlantic_runtime::status::QueryIds;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

/// The labels of a query's own series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueryLabels {
    application: String,
    query: String,
}

/// A query's series of one source.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SourceLabels {
    application: String,
    query: String,
    source: String,
}

/// A query's series of one sink.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SinkLabels {
    application: String,
    query: String,
    sink: String,
}

/// A query's series of one stateful operator.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperatorLabels {
    application: String,
    query: String,
    operator: String,
}

/// A query's series of one diagnostic code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CodeLabels {
    application: String,
    query: String,
    code: String,
}

/// The series of `etlantic_run_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RunLabels {
    application: String,
    query: String,
    run: String,
    pipeline: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The metrics of one query, updated from its progress records.
pub struct QueryMetrics {
    registry: Registry,
    ids: QueryLabels,
    run_info: Family<RunLabels, Gauge>,
    batches: Family<QueryLabels, Counter>,
    input_rows: Family<SourceLabels, Counter>,
    output_rows: Family<SinkLabels, Counter>,
    input_rate: Family<QueryLabels, FloatGauge>,
    processed_rate: Family<QueryLabels, FloatGauge>,
    batch_duration: Family<QueryLabels, Histogram>,
    checkpoint_duration: Family<QueryLabels, Histogram>,
    last_batch: Family<QueryLabels, Gauge>,
    watermark: Family<QueryLabels, FloatGauge>,
    watermark_lag: Family<QueryLabels, FloatGauge>,
    state_rows: Family<OperatorLabels, Gauge>,
    state_bytes: Family<OperatorLabels, Gauge>,
    late_rows: Family<QueryLabels, Counter>,
    quarantined_rows: Family<CodeLabels, Counter>,
    sink_commits: Family<SinkLabels, Counter>,
    backlog_records: Family<SourceLabels, Gauge>,
    backlog_files: Family<SourceLabels, Gauge>,
}

fn seconds_buckets() -> Histogram {
    // 1 ms to ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

impl QueryMetrics {
    /// The metrics of the query `ids` (its first progress record names the rest).
    pub fn new(ids: &QueryIds, pipeline: &str) -> Self {
        let mut registry = Registry::with_prefix("etlantic");
        let m = QueryMetrics {
            ids: QueryLabels {
                application: ids.application_id.clone(),
                query: ids.query_id.clone(),
            },
            run_info: Family::default(),
            batches: Family::default(),
            input_rows: Family::default(),
            output_rows: Family::default(),
            input_rate: Family::default(),
            processed_rate: Family::default(),
            batch_duration: Family::new_with_constructor(seconds_buckets),
            checkpoint_duration: Family::new_with_constructor(seconds_buckets),
            last_batch: Family::default(),
            watermark: Family::default(),
            watermark_lag: Family::default(),
            state_rows: Family::default(),
            state_bytes: Family::default(),
            late_rows: Family::default(),
            quarantined_rows: Family::default(),
            sink_commits: Family::default(),
            backlog_records: Family::default(),
            backlog_files: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "run_info",
            "The run of the query in this process (value 1)",
            m.run_info.clone(),
        );
        registry.register("batches", "Micro-batches run", m.batches.clone());
        registry.register("input_rows", "Rows read, by source", m.input_rows.clone());
        registry.register(
            "output_rows",
            "Rows written, by sink",
            m.output_rows.clone(),
        );
        registry.register(
            "input_rows_per_second",
            "Rows read per second in the last micro-batch",
            m.input_rate.clone(),
        );
        registry.register(
            "processed_rows_per_second",
            "Rows processed per second in the last micro-batch",
            m.processed_rate.clone(),
        );
        registry.register(
            "batch_duration_seconds",
            "Wall time of the micro-batches",
            m.batch_duration.clone(),
        );
        registry.register(
            "checkpoint_duration_seconds",
            "Time a micro-batch spent logging its offsets and commit",
            m.checkpoint_duration.clone(),
        );
        registry.register(
            "last_batch_id",
            "The id of the last micro-batch",
            m.last_batch.clone(),
        );
        registry.register(
            "watermark_seconds",
            "The watermark in force (Unix time)",
            m.watermark.clone(),
        );
        registry.register(
            "watermark_lag_seconds",
            "How far the watermark was behind the last micro-batch's timestamp",
            m.watermark_lag.clone(),
        );
        registry.register(
            "state_rows",
            "Rows in a stateful operator's state",
            m.state_rows.clone(),
        );
        registry.register(
            "state_bytes",
            "Approximate bytes a stateful operator's state holds",
            m.state_bytes.clone(),
        );
        registry.register(
            "late_rows",
            "Rows that arrived behind the watermark",
            m.late_rows.clone(),
        );
        registry.register(
            "quarantined_rows",
            "Records quarantined, by diagnostic code",
            m.quarantined_rows.clone(),
        );
        registry.register(
            "sink_commits",
            "Micro-batches committed to a sink",
            m.sink_commits.clone(),
        );
        registry.register(
            "source_backlog_records",
            "Records a source holds that the query has not read",
            m.backlog_records.clone(),
        );
        registry.register(
            "source_backlog_files",
            "Files a source holds that the query has not read",
            m.backlog_files.clone(),
        );
        m.run_info
            .get_or_create(&RunLabels {
                application: ids.application_id.clone(),
                query: ids.query_id.clone(),
                run: ids.run_id.clone(),
                pipeline: pipeline.to_string(),
            })
            .set(1);
        QueryMetrics { registry, ..m }
    }

    fn source(&self, source: &str) -> SourceLabels {
        SourceLabels {
            application: self.ids.application.clone(),
            query: self.ids.query.clone(),
            source: source.to_string(),
        }
    }

    fn sink(&self, sink: &str) -> SinkLabels {
        SinkLabels {
            application: self.ids.application.clone(),
            query: self.ids.query.clone(),
            sink: sink.to_string(),
        }
    }

    /// Takes in one micro-batch's progress record.
    pub fn observe(&self, p: &QueryProgress) {
        let q = &self.ids;
        self.batches.get_or_create(q).inc();
        self.last_batch.get_or_create(q).set(p.batch_id as i64);
        self.input_rate
            .get_or_create(q)
            .set(p.input_rows_per_second);
        self.processed_rate
            .get_or_create(q)
            .set(p.processed_rows_per_second);
        self.batch_duration
            .get_or_create(q)
            .observe(p.batch_duration as f64 / 1000.0);
        let logged: u64 = ["walCommit", "commitOffsets"]
            .iter()
            .filter_map(|phase| p.duration_ms.get(*phase))
            .sum();
        self.checkpoint_duration
            .get_or_create(q)
            .observe(logged as f64 / 1000.0);
        self.late_rows.get_or_create(q).inc_by(p.late_rows);
        let ms = |iso: &str| {
            chrono::DateTime::parse_from_rfc3339(iso)
                .ok()
                .map(|d| d.timestamp_millis())
        };
        if let Some(wm) = p.event_time.watermark.as_deref().and_then(ms) {
            self.watermark.get_or_create(q).set(wm as f64 / 1000.0);
            if let Some(at) = ms(&p.timestamp) {
                self.watermark_lag
                    .get_or_create(q)
                    .set((at - wm) as f64 / 1000.0);
            }
        }
        for s in &p.sources {
            let id = s.source_id.as_deref().unwrap_or(&s.description);
            let labels = self.source(id);
            self.input_rows
                .get_or_create(&labels)
                .inc_by(s.num_input_rows);
            if let Some(b) = s.backlog {
                if let Some(r) = b.records {
                    self.backlog_records.get_or_create(&labels).set(r as i64);
                }
                if let Some(f) = b.files {
                    self.backlog_files.get_or_create(&labels).set(f as i64);
                }
            }
        }
        for k in &p.sinks {
            let labels = self.sink(k.sink_id.as_deref().unwrap_or_default());
            self.output_rows
                .get_or_create(&labels)
                .inc_by(k.num_output_rows.max(0) as u64);
            self.sink_commits.get_or_create(&labels).inc();
        }
        for op in &p.state_operators {
            let labels = OperatorLabels {
                application: q.application.clone(),
                query: q.query.clone(),
                operator: op.operator_id.clone(),
            };
            self.state_rows
                .get_or_create(&labels)
                .set(op.num_rows_total as i64);
            self.state_bytes
                .get_or_create(&labels)
                .set(op.memory_used_bytes as i64);
        }
        for (code, n) in &p.quarantined_by_code {
            let labels = CodeLabels {
                application: q.application.clone(),
                query: q.query.clone(),
                code: code.clone(),
            };
            self.quarantined_rows.get_or_create(&labels).inc_by(*n);
        }
    }

    /// The metrics in Prometheus' text format (version 0.0.4).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

/// The content type of [`QueryMetrics::encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The metrics a server shows: none until the query has started and its ids are known.
pub type SharedMetrics = Arc<Mutex<Option<QueryMetrics>>>;

/// Serves `GET /metrics` (and `/`) at `addr` from `metrics` until the returned task is
/// aborted. Binds before returning, so a taken address fails the run at its start.
pub async fn serve(
    addr: SocketAddr,
    metrics: SharedMetrics,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    use hyper::{Response, StatusCode};
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let metrics = metrics.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<_>| {
                let metrics = metrics.clone();
                async move {
                    let response = match req.uri().path() {
                        "/metrics" | "/" => {
                            let body = match metrics.lock() {
                                Ok(m) => m.as_ref().map(QueryMetrics::encode),
                                Err(_) => None,
                            }
                            // Before the query has started: no series yet.
                            .unwrap_or_default();
                            Response::builder()
                                .header("content-type", CONTENT_TYPE)
                                .body(Full::new(Bytes::from(body)))
                        }
                        _ => Response::builder()
                            .status(StatusCode::NOT_FOUND)
                            .body(Full::new(Bytes::from_static(b"not found; try /metrics\n"))),
                    };
                    Ok::<_, std::convert::Infallible>(response.expect("a valid response"))
                }
            });
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                // A scraper that hangs up early is its own business.
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, service)
                    .await;
            });
        }
    });
    Ok((bound, task))
}

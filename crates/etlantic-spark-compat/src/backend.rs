//! The Spark backend: batch regions compiled into Spark Connect plans and run on the
//! Spark Connect endpoint it was given (`sc://host:port`).
//!
//! A region's input tables travel to Spark as local relations (inside the plan, through
//! the driver), its steps become one Spark plan per output, and the outputs come back
//! as Arrow in the region's row order, cast to exactly the schema the plan promised
//! (the embedded engine's output schema for the same steps: both compute DTCS).
//!
//! The `apache-spark-connect` client blocks on its own runtime, so every call runs on a
//! blocking thread (`spawn_blocking`), never on an async worker.

use crate::compile::{self, Rel, ORD};
use crate::convert;
use crate::expr::{ident, Kind};
use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use etlantic_core::data::Table;
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::plugin::{Backend, BackendCapabilities, RegionLocation, StepLogic, StepTask};
use indexmap::IndexMap;
use spark_connect::session::SparkSession;
use std::sync::{Arc, Mutex};

/// Runs batch regions on a Spark Connect endpoint.
///
/// The linked backend (registered as `spark`) has no endpoint: the planner binds each
/// region placed on it to the profile's `endpoints: {spark: sc://host:port}` and runs
/// it on [`Backend::at_location`]'s result.
pub struct SparkBackend {
    endpoint: Option<Arc<Endpoint>>,
}

/// The linked backend, bound to an endpoint per region.
pub static SPARK: SparkBackend = SparkBackend { endpoint: None };

inventory::submit! { etlantic_core::plugin::BackendRegistration(&SPARK) }

/// The endpoint and its session, shared with the blocking threads that use it.
struct Endpoint {
    url: String,
    session: Mutex<Option<SparkSession>>,
}

impl SparkBackend {
    /// A backend for the endpoint `url` (`sc://host:port[/;token=...]`). It connects on
    /// first use.
    pub fn new(url: impl Into<String>) -> Self {
        SparkBackend {
            endpoint: Some(Arc::new(Endpoint {
                url: url.into(),
                session: Mutex::new(None),
            })),
        }
    }

    /// The endpoint (`None` for the linked, unbound backend).
    pub fn url(&self) -> Option<&str> {
        self.endpoint.as_ref().map(|e| e.url.as_str())
    }
}

impl Endpoint {
    /// The session, connecting first when there is none (blocking).
    fn session(&self) -> Result<SparkSession> {
        let mut guard = self.session.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = guard.as_ref() {
            return Ok(s.clone());
        }
        let s = connect(&self.url)?;
        *guard = Some(s.clone());
        Ok(s)
    }
}

/// A session at the Spark Connect endpoint `url` (blocking), `ETL710` when nothing
/// accepts connections there.
pub(crate) fn connect(url: &str) -> Result<SparkSession> {
    reachable(url)?;
    SparkSession::builder()
        .remote(url)
        .get_or_create()
        .map_err(|e| unreachable_endpoint(url, e))
}

/// Fails fast (`ETL710`) when nothing accepts connections at the endpoint: the client
/// would retry an unavailable server with backoff for about ten minutes.
fn reachable(url: &str) -> Result<()> {
    let authority = url
        .strip_prefix("sc://")
        .ok_or_else(|| unreachable_endpoint(url, "not an sc:// URL"))?;
    let authority = authority.split(['/', ';']).next().unwrap_or_default();
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (
            h.trim_matches(['[', ']']),
            p.parse::<u16>()
                .map_err(|_| unreachable_endpoint(url, format!("bad port `{p}`")))?,
        ),
        // Spark Connect's default port.
        None => (authority, 15002),
    };
    let addrs: Vec<std::net::SocketAddr> = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
        .map_err(|e| unreachable_endpoint(url, e))?
        .collect();
    let timeout = std::time::Duration::from_secs(10);
    let mut last = None;
    for a in &addrs {
        match std::net::TcpStream::connect_timeout(a, timeout) {
            Ok(_) => return Ok(()),
            Err(e) => last = Some(e),
        }
    }
    Err(unreachable_endpoint(
        url,
        last.map(|e| e.to_string())
            .unwrap_or_else(|| format!("`{host}` has no address")),
    ))
}

fn unreachable_endpoint(url: &str, e: impl std::fmt::Display) -> Error {
    Error::new(
        &codes::ENGINE_UNREACHABLE,
        format!("cannot connect to Spark Connect at {url}: {e}"),
    )
    .with_help("Start the server (Spark's sbin/start-connect-server.sh) or correct the endpoint.")
}

fn engine(what: &str, e: impl std::fmt::Display) -> Error {
    Error::new(&codes::ENGINE_ERROR, format!("Spark: {what}: {e}"))
}

fn kinds(schema: &SchemaRef) -> Vec<(String, Kind)> {
    schema
        .fields()
        .iter()
        .map(|f| (f.name().clone(), Kind::of(f.data_type())))
        .collect()
}

/// A table handed to Spark as a relation with its ordinal.
fn upload(session: &SparkSession, table: &Table) -> Result<Rel> {
    let position = "__etl_pos";
    let (rows, schema) = convert::to_rows(table, position)?;
    let df = session
        .create_dataframe(rows, schema)
        .map_err(|e| engine("sending a table", e))?;
    let columns = kinds(&table.schema);
    let mut exprs: Vec<spark_connect::Column> = columns
        .iter()
        .map(|(n, _)| spark_connect::functions::col(n))
        .collect();
    exprs.push(spark_connect::functions::expr(&format!(
        "array({}) AS {}",
        ident(position),
        ident(ORD)
    )));
    Ok(Rel {
        df: df.select(exprs),
        columns,
    })
}

impl Endpoint {
    fn run_region(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>> {
        let session = self.session()?;
        let mut schemas: IndexMap<String, SchemaRef> = inputs
            .iter()
            .map(|(n, t)| (n.clone(), t.schema.clone()))
            .collect();
        let mut relations: IndexMap<String, Rel> = IndexMap::new();
        let mut tables = inputs;
        for (name, table) in &tables {
            relations.insert(name.clone(), upload(&session, table)?);
        }
        for task in steps {
            let at = |e: Error| e.map_diagnostics(|d| d.at(format!("transforms[{}]", task.id)));
            let port_schemas = task.port_inputs(&schemas)?;
            let schema = output_schema(task, &port_schemas).map_err(at)?;
            let ports = task.port_inputs(&relations)?;
            let StepLogic::Portable {
                plan,
                parameters,
                output,
            } = &task.logic
            else {
                return Err(at(not_portable(task)));
            };
            let rel = compile::plan(plan.decoded(), parameters, &ports, output).map_err(at)?;
            schemas.insert(task.id.clone(), schema);
            relations.insert(task.id.clone(), rel);
        }
        let mut out = IndexMap::new();
        for name in outputs {
            if let Some(t) = tables.shift_remove(name) {
                out.insert(name.clone(), t);
                continue;
            }
            let rel = relations.get(name).ok_or_else(|| {
                Error::new(
                    &codes::UNKNOWN_NODE,
                    format!("output `{name}` is neither an input of the region nor a step"),
                )
            })?;
            let batches = rel
                .ordered_output()
                .collect_record_batches()
                .map_err(|e| engine(&format!("running `{name}`"), e))?;
            out.insert(name.clone(), convert::conform(batches, &schemas[name])?);
        }
        Ok(out)
    }
}

fn not_portable(task: &StepTask) -> Error {
    Error::new(
        &codes::BACKEND_UNSUPPORTED_ACTION,
        format!(
            "step `{}` is not a portable DTCS plan; the Spark backend runs only those",
            task.id
        ),
    )
}

/// The Spark Connect URL of a region's location (`sc://host:port`, secret references
/// already resolved): Spark Connect's own parameters follow `/;`
/// (`sc://host:15002/;token=...`), and `?k=v` parameters of the binding are passed the
/// same way. Another scheme is `ETL506`.
pub fn endpoint_url(uri: &etlantic_core::uri::BindingUri) -> Result<String> {
    if uri.scheme != "sc" {
        return Err(Error::new(
            &codes::REGION_LOCATION,
            format!(
                "the Spark backend runs at a Spark Connect endpoint (sc://host:port), not at {}",
                uri.redacted()
            ),
        ));
    }
    let mut url = format!("sc://{}", uri.location);
    if !uri.params.is_empty() && !url.contains("/;") {
        url.push('/');
    }
    for (k, v) in &uri.params {
        url.push_str(&format!(";{k}={v}"));
    }
    Ok(url)
}

/// The name regions and profiles give the Spark backend.
pub const BACKEND_NAME: &str = "spark";

#[async_trait]
impl Backend for SparkBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> BackendCapabilities {
        crate::capabilities::capabilities()
    }

    /// The embedded engine's schema for the same step: both compute DTCS, and Spark's
    /// results are cast to it. Steps this backend cannot compile are refused here.
    fn output_schema(
        &self,
        step: &StepTask,
        inputs: &IndexMap<String, SchemaRef>,
    ) -> Result<SchemaRef> {
        output_schema(step, inputs)
    }

    /// The same backend at `sc://` endpoint `location.uri` (its parameters, e.g. a
    /// bearer token `;token=...`, are part of the location).
    fn at_location(&self, location: &RegionLocation) -> Result<Arc<dyn Backend>> {
        Ok(Arc::new(SparkBackend::new(endpoint_url(&location.uri)?)))
    }

    async fn execute_batch(
        &self,
        steps: &[StepTask],
        inputs: IndexMap<String, Table>,
        outputs: &[String],
    ) -> Result<IndexMap<String, Table>> {
        let endpoint = self.endpoint.clone().ok_or_else(|| {
            Error::new(
                &codes::REGION_LOCATION,
                "a Spark region has no endpoint to run at",
            )
            .with_help("Name it in the profile: `endpoints: {spark: sc://host:15002}`.")
        })?;
        let steps = steps.to_vec();
        let outputs = outputs.to_vec();
        tokio::task::spawn_blocking(move || endpoint.run_region(&steps, inputs, &outputs))
            .await
            .map_err(|e| engine("the region's thread", e))?
    }
}

fn output_schema(step: &StepTask, inputs: &IndexMap<String, SchemaRef>) -> Result<SchemaRef> {
    let StepLogic::Portable { plan, .. } = &step.logic else {
        return Err(not_portable(step));
    };
    // Which actions a region of which kind runs is the planner's check (the
    // capabilities); here only actions no Spark region runs are refused.
    for node in &plan.decoded().steps {
        let id = node.op.id();
        let known = crate::capabilities::ACTIONS.contains(&id)
            || crate::capabilities::STREAMING_ACTIONS.contains(&id);
        if !known {
            return Err(Error::new(
                &codes::BACKEND_UNSUPPORTED_ACTION,
                format!("the Spark backend does not run the action `{id}`"),
            ));
        }
    }
    etlantic_datafusion::DataFusionBackend.output_schema(step, inputs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etlantic_core::uri::BindingUri;

    #[test]
    fn endpoints_become_spark_connect_urls_with_their_parameters() {
        let url = |s: &str| endpoint_url(&BindingUri::parse(s).unwrap());
        assert_eq!(url("sc://spark:15002").unwrap(), "sc://spark:15002");
        // A bearer token and TLS travel as Spark Connect's `/;k=v` parameters.
        assert_eq!(
            url("sc://spark:443?token=abc&use_ssl=true").unwrap(),
            "sc://spark:443/;token=abc;use_ssl=true"
        );
        assert_eq!(
            url("sc://spark:15002/;token=abc").unwrap(),
            "sc://spark:15002/;token=abc"
        );
        let e = url("postgres://db/x").unwrap_err();
        assert_eq!(e.code(), "ETL506");
    }
}

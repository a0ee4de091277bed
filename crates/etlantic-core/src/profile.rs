//! Execution profiles: the operational half of a pipeline. A profile binds logical assets
//! to physical URIs and holds the run mode, trigger, checkpoint location, per-step engine
//! overrides, the bad-record policy and secret references. None of this lives in the
//! pipeline definition, so one pipeline runs unchanged in dev, CI and production.

use crate::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use crate::guarantee::DeliveryGuarantee;
use crate::streaming::{ByteSize, Duration, ExecutionMode, Trigger, WatermarkPolicy};
use crate::uri::{self, BindingUri};
use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// What to do with a record that breaks its contract.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Write it to the quarantine output with its reason and position; carry on.
    #[default]
    Quarantine,
    /// Stop the run with `ETL705`.
    Fail,
}

impl OnError {
    /// The quality-rule policy this setting stands for (the default of rules that point at
    /// records).
    pub fn as_policy(self) -> crate::contract::rules::Policy {
        match self {
            OnError::Quarantine => crate::contract::rules::Policy::Quarantine,
            OnError::Fail => crate::contract::rules::Policy::Fail,
        }
    }
}

/// A profile document (`apiVersion: etlantic/v1`, `kind: Profile`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Must be `etlantic/v1`.
    #[serde(rename = "apiVersion", default = "api_version")]
    pub api_version: String,
    /// Must be `Profile`.
    #[serde(default = "profile_kind")]
    pub kind: String,
    /// Name of the profile (e.g. `local`, `prod`).
    pub name: String,
    /// The application the pipeline's queries belong to, named in every progress
    /// record, run report, log line, metric and lineage event (`etlantic status` shows
    /// it). Unset, a streaming query generates one when its checkpoint is created and
    /// keeps it there; a batch run uses one of its own. Letters, digits, `.`, `_`, `-`
    /// and `:`, at most 128.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub application_id: Option<String>,
    /// Logical asset → URI, e.g. `raw_orders: file://data/orders.jsonl`.
    #[serde(default)]
    pub bindings: IndexMap<String, String>,
    /// Where bad records go (a file URI); defaults to `file://out/quarantine.jsonl`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantine: Option<String>,
    /// What to do with bad records.
    #[serde(default)]
    pub on_error: OnError,
    /// Bounded or unbounded run.
    #[serde(default)]
    pub mode: ExecutionMode,
    /// When micro-batches run (streaming only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trigger: Option<Trigger>,
    /// Checkpoint directory (streaming only), e.g. `file://.etlantic/checkpoints/orders`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint: Option<String>,
    /// How the global watermark combines inputs.
    #[serde(default, skip_serializing_if = "is_default")]
    pub watermark_policy: WatermarkPolicy,
    /// Whether a no-data micro-batch runs when the watermark advances (Spark default: on).
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub no_data_batches: bool,
    /// The end-to-end guarantee every source/sink pair must give; planning fails otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_guarantee: Option<DeliveryGuarantee>,
    /// Per-step engine overrides: transformation id → backend name.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub engines: IndexMap<String, String>,
    /// Endpoints of backends that run in another system, by backend name (e.g.
    /// `spark: sc://spark-host:15002`). A step placed on such a backend that reads and
    /// feeds nothing in a system of that kind runs at this endpoint.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub endpoints: IndexMap<String, String>,
    /// Streaming state time-to-live: transformation id (every stateful operator of it) or
    /// operator id (`<transformation>.<step>`) → how long a state row is kept without an
    /// update, in processing time. Meant for state no watermark bounds (group-bys, dedup
    /// and joins without one); ignored in batch runs.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub state_ttl: IndexMap<String, Duration>,
    /// How often the streaming operators' state is written to the checkpoint, in
    /// processing time (Flink's checkpoint interval). Unset (the default, Spark's way):
    /// after every micro-batch. Set, a micro-batch writes the state only once this much
    /// time has passed since the last write; the offsets and commits are still logged
    /// for every micro-batch, and a restart rebuilds the state by running the committed
    /// micro-batches since the last write again (reading their logged offsets, writing
    /// nothing), so each source must be able to give those offsets again. Trades recovery
    /// time for less work per micro-batch. Ignored in batch runs, and on Spark (whose
    /// state store checkpoints every micro-batch): results never depend on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_checkpoint_interval: Option<Duration>,
    /// Where streaming operators keep their state: `memory` (the default: all of it in
    /// memory, checkpointed as changes and snapshots) or `disk` (RocksDB on the local
    /// disk, its memory bounded by `state_memory_limit`, checkpointed incrementally), or
    /// the name of another linked state store. Ignored in batch runs.
    #[serde(default = "memory_store", skip_serializing_if = "is_memory_store")]
    pub state_store: String,
    /// What a disk state store may hold in memory (block cache and write buffers) for the
    /// whole query, shared among its operators. Default [`DEFAULT_STATE_MEMORY_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_memory_limit: Option<ByteSize>,
    /// How many versions the disk state store may commit as changelogs alone before it
    /// takes a snapshot (default 100; it snapshots sooner when the changelogs since the
    /// last snapshot hold half of that snapshot's bytes). Fewer versions: a restart
    /// replays less; more: fewer snapshot uploads. Spark's `minDeltasForSnapshot`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_snapshot_every: Option<std::num::NonZeroU64>,
    /// The local directory of the disk state store's working copies (relative to the
    /// project root; default [`DEFAULT_STATE_LOCAL_DIR`]). It is a cache: the checkpoint
    /// holds the state, and a query restarted without it restores from there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_local_dir: Option<String>,
    /// Quality-rule policies: rule id (`orders.amount.range`, see
    /// [`crate::contract::rules`]) → `fail | drop | quarantine | warn`. Rules not listed
    /// keep the policy their contract declares, else `on_error` (rules that point at
    /// records) or `warn` (row counts, SQL measures).
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub quality_policies: IndexMap<String, crate::contract::rules::Policy>,
    /// Named secrets: name → reference (`${env:NAME}`). Values are resolved at run time only.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub secrets: IndexMap<String, String>,
    /// Options of the object stores the pipeline's locations name (`s3://…`): `endpoint`,
    /// `region`, `access_key_id`, `secret_access_key`, `session_token`, `allow_http`, …
    /// (see docs/connectors.md, "Object stores"). They override the standard `AWS_*`
    /// environment variables. Credentials must be references (`${secret:NAME}`,
    /// `${env:VAR}`): a plain one is `ETL602`.
    #[serde(default, skip_serializing_if = "IndexMap::is_empty")]
    pub storage_options: IndexMap<String, String>,
    /// Where the runs' OpenLineage events go (see [`LineageConfig`]); unset, none are
    /// sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lineage: Option<LineageConfig>,
    /// Extensions (`x-...` keys), kept but not interpreted.
    #[serde(flatten)]
    pub extensions: IndexMap<String, serde_yaml::Value>,
}

/// Where a pipeline's OpenLineage run events go (profile `lineage`): `START` when a run
/// starts, `RUNNING` after micro-batches, `COMPLETE`, `ABORT` or `FAIL` at its end.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LineageConfig {
    /// `file://PATH` (one JSON event per line, appended; relative to the project) or
    /// `http(s)://HOST/api/v1/lineage` (one POST per event: Marquez's API and any
    /// OpenLineage HTTP endpoint). May hold secret references.
    pub url: String,
    /// The jobs' namespace (default: the profile's `application_id`, else `etlantic`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Sent as `Authorization: Bearer <key>` over HTTP; must be a reference
    /// (`${secret:NAME}`, `${env:VAR}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key: Option<String>,
    /// The least time between two `RUNNING` events of a streaming run (default 60
    /// seconds; `0 seconds`: after every micro-batch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_interval: Option<Duration>,
}

impl LineageConfig {
    /// Diagnostics for a URL that is neither `file://` nor `http(s)://`, and a plain-text
    /// API key.
    fn validate(&self, origin: &str, d: &mut Diagnostics) {
        let scheme_ok = ["file://", "http://", "https://"]
            .iter()
            .any(|s| self.url.starts_with(s) && self.url.len() > s.len());
        if !scheme_ok {
            d.push(
                Diagnostic::new(
                    &codes::BAD_URI,
                    format!(
                        "the lineage url `{}` is neither file:// nor http(s)://",
                        uri::redact(&self.url)
                    ),
                )
                .at("lineage.url")
                .in_file(origin)
                .help("Use `file://out/lineage.jsonl` (JSON lines) or `http://HOST:5000/api/v1/lineage` (Marquez)."),
            );
        }
        if let Some(key) = &self.api_key {
            if !uri::is_secret_reference(key) {
                d.push(
                    Diagnostic::new(
                        &codes::SECRET_IN_PLAIN,
                        "the lineage `api_key` is in plain text",
                    )
                    .at("lineage.api_key")
                    .in_file(origin)
                    .help("Name a secret (`api_key: ${secret:marquez}`) and give its value in the environment."),
                );
            }
        }
    }
}

fn api_version() -> String {
    "etlantic/v1".into()
}
fn profile_kind() -> String {
    "Profile".into()
}
fn memory_store() -> String {
    MEMORY_STATE_STORE.into()
}
fn is_memory_store(name: &str) -> bool {
    name == MEMORY_STATE_STORE
}
fn yes() -> bool {
    true
}
fn is_true(b: &bool) -> bool {
    *b
}
fn is_default<T: Default + PartialEq>(t: &T) -> bool {
    *t == T::default()
}

/// The state store that keeps operator state in memory (the default `state_store`).
pub const MEMORY_STATE_STORE: &str = "memory";

/// The default `state_memory_limit`: 256 MB.
pub const DEFAULT_STATE_MEMORY_LIMIT: ByteSize = ByteSize::from_bytes(256_000_000);

/// The least `state_memory_limit` accepted: 16 MB.
pub const MIN_STATE_MEMORY_LIMIT: ByteSize = ByteSize::from_bytes(16_000_000);

/// The default `state_local_dir`.
pub const DEFAULT_STATE_LOCAL_DIR: &str = ".etlantic/state";

/// The quarantine output used when a profile names none.
pub const DEFAULT_QUARANTINE: &str = "file://out/quarantine.jsonl";

impl Profile {
    /// A profile with no bindings.
    pub fn new(name: impl Into<String>) -> Self {
        Profile {
            api_version: api_version(),
            kind: profile_kind(),
            name: name.into(),
            application_id: None,
            bindings: IndexMap::new(),
            quarantine: None,
            on_error: OnError::default(),
            mode: ExecutionMode::default(),
            trigger: None,
            checkpoint: None,
            watermark_policy: WatermarkPolicy::default(),
            no_data_batches: true,
            require_guarantee: None,
            engines: IndexMap::new(),
            endpoints: IndexMap::new(),
            state_ttl: IndexMap::new(),
            state_checkpoint_interval: None,
            state_store: memory_store(),
            state_memory_limit: None,
            state_snapshot_every: None,
            state_local_dir: None,
            lineage: None,
            quality_policies: IndexMap::new(),
            secrets: IndexMap::new(),
            storage_options: IndexMap::new(),
            extensions: IndexMap::new(),
        }
    }

    /// Adds a binding (builder style).
    pub fn bind(mut self, asset: impl Into<String>, uri: impl Into<String>) -> Self {
        self.bindings.insert(asset.into(), uri.into());
        self
    }

    /// Parses a profile from YAML, checking its header, extensions, URIs and secrets.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Self> {
        let profile: Profile = crate::model::yaml::from_str(text, origin)?;
        profile.check(origin)?;
        Ok(profile)
    }

    /// Reads a profile file.
    pub fn load(path: &std::path::Path, origin: &str) -> Result<Self> {
        let text = crate::model::yaml::read_file(path, origin)?;
        Self::from_yaml(&text, origin)
    }

    /// Checks everything that can be checked without the pipeline.
    pub fn check(&self, origin: &str) -> Result<()> {
        let mut d = Diagnostics::new();
        if self.api_version != "etlantic/v1" || self.kind != "Profile" {
            d.push(
                Diagnostic::new(
                    &codes::UNSUPPORTED_VERSION,
                    format!(
                        "unsupported profile header `{}`/`{}`",
                        self.api_version, self.kind
                    ),
                )
                .in_file(origin)
                .help("Write `apiVersion: etlantic/v1` and `kind: Profile`."),
            );
        }
        for key in self.extensions.keys() {
            if !key.starts_with("x-") {
                d.push(
                    Diagnostic::new(
                        &codes::UNKNOWN_FIELD,
                        format!("unknown profile field `{key}`"),
                    )
                    .in_file(origin)
                    .at(key.clone()),
                );
            }
        }
        let mut uris: Vec<(String, &String)> = self
            .bindings
            .iter()
            .map(|(k, v)| (format!("bindings.{k}"), v))
            .collect();
        if let Some(q) = &self.quarantine {
            uris.push(("quarantine".into(), q));
        }
        if let Some(c) = &self.checkpoint {
            uris.push(("checkpoint".into(), c));
        }
        uris.extend(
            self.endpoints
                .iter()
                .map(|(k, v)| (format!("endpoints.{k}"), v)),
        );
        for (path, text) in uris {
            if let Err(e) = BindingUri::parse(text) {
                d.extend(e.map_diagnostics(|x| x.at(path.clone()).in_file(origin)).0);
                continue;
            }
            for what in uri::plain_credentials(text) {
                let what = if what == "password" && text.contains('@') {
                    "the password of its user-info (`user:password@`)".to_string()
                } else {
                    format!("option `{what}`")
                };
                d.push(
                    Diagnostic::new(
                        &codes::SECRET_IN_PLAIN,
                        format!(
                            "`{path}` holds a credential in plain text in {what}: {}",
                            uri::redact(text)
                        ),
                    )
                    .at(path.clone())
                    .in_file(origin),
                );
            }
        }
        for (name, reference) in &self.secrets {
            if !uri::is_secret_reference(reference) {
                d.push(
                    Diagnostic::new(
                        &codes::SECRET_IN_PLAIN,
                        format!("secret `{name}` is not a reference"),
                    )
                    .at(format!("secrets.{name}"))
                    .in_file(origin),
                );
            }
        }
        for (key, value) in &self.storage_options {
            if uri::is_credential_key(key) && !uri::is_secret_reference(value) {
                d.push(
                    Diagnostic::new(
                        &codes::SECRET_IN_PLAIN,
                        format!("storage option `{key}` holds a credential in plain text"),
                    )
                    .at(format!("storage_options.{key}"))
                    .in_file(origin),
                );
            }
        }
        for (op, ttl) in &self.state_ttl {
            if ttl.as_millis() <= 0 {
                d.push(
                    Diagnostic::new(
                        &codes::BAD_DURATION,
                        format!("the state TTL of `{op}` must be positive"),
                    )
                    .at(format!("state_ttl.{op}"))
                    .in_file(origin),
                );
            }
        }
        if let Some(id) = &self.application_id {
            if let Err(why) = check_application_id(id) {
                d.push(
                    Diagnostic::new(
                        &codes::INVALID_ID,
                        format!("`application_id` `{id}` {why}"),
                    )
                    .at("application_id")
                    .in_file(origin)
                    .help("Use letters, digits, `.`, `_`, `-` and `:` (at most 128), e.g. `orders-prod`."),
                );
            }
        }
        if let Some(l) = &self.lineage {
            l.validate(origin, &mut d);
        }
        if self.state_store.trim().is_empty() {
            d.push(
                Diagnostic::new(&codes::STATE_STORE_UNKNOWN, "`state_store` is empty")
                    .at("state_store")
                    .in_file(origin),
            );
        }
        if let Some(limit) = self.state_memory_limit {
            if limit < MIN_STATE_MEMORY_LIMIT {
                d.push(
                    Diagnostic::new(
                        &codes::BAD_BYTE_SIZE,
                        format!("`state_memory_limit` of {limit} is below the least a disk state store can work in ({MIN_STATE_MEMORY_LIMIT})"),
                    )
                    .at("state_memory_limit")
                    .in_file(origin),
                );
            }
        }
        d.into_result()
    }

    /// The parsed binding of an asset.
    pub fn binding(&self, asset: &str) -> Option<Result<BindingUri>> {
        self.bindings.get(asset).map(|u| BindingUri::parse(u))
    }

    /// The quarantine URI (the default when none is set).
    pub fn quarantine_uri(&self) -> &str {
        self.quarantine.as_deref().unwrap_or(DEFAULT_QUARANTINE)
    }
}

/// Whether `id` may name an application: 1 to 128 letters, digits, `.`, `_`, `-`, `:`
/// (it becomes a Prometheus label value, an OpenLineage namespace, part of file names).
pub fn check_application_id(id: &str) -> std::result::Result<(), &'static str> {
    if id.is_empty() || id.len() > 128 {
        return Err("must be 1 to 128 characters long");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':'))
    {
        return Err("may hold only letters, digits, `.`, `_`, `-` and `:`");
    }
    Ok(())
}

/// Replaces every `${env:NAME}` and `${secret:NAME}` in `text`: environment variables
/// directly, secrets through the profile's `secrets` table. Only call this at run time,
/// on values that are never written to a plan, report or log.
pub fn resolve_secrets(text: &str, profile: &Profile) -> Result<String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| {
            Error::new(&codes::UNKNOWN_SECRET, "unterminated `${` secret reference")
        })?;
        let reference = &after[..end];
        let value = match reference.split_once(':') {
            Some(("env", name)) => std::env::var(name).map_err(|_| {
                Error::new(
                    &codes::UNKNOWN_SECRET,
                    format!("environment variable `{name}` is not set"),
                )
            })?,
            Some(("secret", name)) => {
                let inner = profile.secrets.get(name).ok_or_else(|| {
                    Error::new(
                        &codes::UNKNOWN_SECRET,
                        format!("secret `{name}` is not declared in the profile"),
                    )
                })?;
                if inner.contains("${secret:") {
                    return Err(Error::new(
                        &codes::UNKNOWN_SECRET,
                        format!("secret `{name}` refers to another secret"),
                    ));
                }
                resolve_secrets(inner, profile)?
            }
            _ => {
                return Err(Error::new(
                    &codes::UNKNOWN_SECRET,
                    format!("cannot resolve `${{{reference}}}`: expected env:NAME or secret:NAME"),
                ))
            }
        };
        out.push_str(&value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_profile() {
        let p = Profile::from_yaml(
            "apiVersion: etlantic/v1\nkind: Profile\nname: local\nbindings:\n  raw: file://data/raw.jsonl\nmode: streaming\ntrigger: processing_time 10 seconds\nrequire_guarantee: exactly_once\n",
            "profile.yaml",
        )
        .unwrap();
        assert_eq!(p.mode, ExecutionMode::Streaming);
        assert_eq!(p.require_guarantee, Some(DeliveryGuarantee::ExactlyOnce));
        assert_eq!(
            p.binding("raw").unwrap().unwrap().location,
            "data/raw.jsonl"
        );
        assert!(p.no_data_batches);
    }

    #[test]
    fn plain_passwords_and_unknown_fields_are_refused() {
        let e = Profile::from_yaml(
            "name: x\nbindings:\n  db: postgres://u:pw@localhost/test\n",
            "p.yaml",
        )
        .unwrap_err();
        assert_eq!(e.code(), "ETL602");
        assert!(!e.to_string().contains("pw@"));
        let e = Profile::from_yaml("name: x\nbindngs: {}\n", "p.yaml").unwrap_err();
        assert_eq!(e.code(), "ETL003");
    }

    #[test]
    fn resolves_secrets_at_run_time() {
        std::env::set_var("ETLANTIC_TEST_PW", "s3cret");
        let mut p = Profile::new("t");
        p.secrets
            .insert("pg".into(), "${env:ETLANTIC_TEST_PW}".into());
        assert_eq!(
            resolve_secrets("postgres://u:${secret:pg}@h/db", &p).unwrap(),
            "postgres://u:s3cret@h/db"
        );
        assert_eq!(
            resolve_secrets("${env:ETLANTIC_NOPE_NOPE}", &p)
                .unwrap_err()
                .code(),
            "ETL207"
        );
    }
}

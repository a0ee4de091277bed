//! The catalogue of stable diagnostic codes.
//!
//! A code never changes meaning once released; retired codes are not reused. Ranges:
//! `ETL0xx` load, `ETL1xx` structural, `ETL2xx` reference, `ETL3xx` semantic and
//! contracts, `ETL4xx` streaming, `ETL5xx` capability, `ETL6xx` guarantee and policy,
//! `ETL7xx` execution and data, `ETL8xx` checkpoint, `ETL9xx` planning and plans.

use super::{Phase, Severity};

/// The fixed description of one diagnostic code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeInfo {
    /// The stable code, e.g. `ETL201`.
    pub code: &'static str,
    /// A short name of the rule (used as the SARIF rule name).
    pub name: &'static str,
    /// The phase that reports it.
    pub phase: Phase,
    /// The default severity.
    pub severity: Severity,
    /// What it means, in one sentence.
    pub title: &'static str,
    /// The default hint on how to fix it.
    pub help: &'static str,
}

macro_rules! catalogue {
    ($( $(#[$m:meta])* $ident:ident = ($code:literal, $name:literal, $phase:ident, $sev:ident, $title:literal, $help:literal); )*) => {
        $(
            $(#[$m])*
            #[doc = concat!("`", $code, "` — ", $title)]
            pub const $ident: CodeInfo = CodeInfo {
                code: $code,
                name: $name,
                phase: Phase::$phase,
                severity: Severity::$sev,
                title: $title,
                help: $help,
            };
        )*
        /// Every code, in code order.
        pub const ALL: &[CodeInfo] = &[$($ident),*];
    };
}

catalogue! {
    // ---- load ----
    FILE_UNREADABLE = ("ETL001", "file-unreadable", Load, Error,
        "A file named by the pipeline, a profile or the command line cannot be read.",
        "Check that the path exists relative to the project root and is readable.");
    YAML_SYNTAX = ("ETL002", "yaml-syntax", Load, Error,
        "A YAML or JSON document is not well formed or does not match the expected shape.",
        "Fix the syntax at the reported line; `etlantic init` writes a valid example.");
    UNKNOWN_FIELD = ("ETL003", "unknown-field", Load, Error,
        "A document has a field ETLantic does not know.",
        "Remove the field or fix its spelling; extensions go under a key starting with `x-`.");
    UNSUPPORTED_VERSION = ("ETL004", "unsupported-version", Load, Error,
        "A document declares an apiVersion/kind this version of ETLantic cannot read.",
        "Use `apiVersion: etlantic/v1` for pipelines and profiles.");
    CONTRACT_INVALID = ("ETL005", "contract-invalid", Load, Error,
        "An ODCS data contract failed to parse or to validate.",
        "Fix the contract; the message quotes the ODCS validator.");
    TRANSFORM_PLAN_INVALID = ("ETL006", "transform-plan-invalid", Load, Error,
        "A DTCS transform plan failed to parse or to validate.",
        "Fix the plan; the message quotes the DTCS validator.");
    BAD_URI = ("ETL007", "bad-uri", Load, Error,
        "A binding URI in a profile cannot be parsed.",
        "Write URIs as scheme://path, e.g. file://data/orders.jsonl or kafka://broker/topic.");
    BAD_DURATION = ("ETL008", "bad-duration", Load, Error,
        "A duration cannot be parsed.",
        "Write durations as `<integer> <unit>` with unit milliseconds, seconds, minutes, hours or days, e.g. `5 minutes`.");
    CONTRACT_KIND_MISMATCH = ("ETL009", "contract-kind-mismatch", Load, Error,
        "`etlantic diff` was given two documents of different kinds: contracts of two different standards (ODCS, DTCS, DPCS), or a contract and a pipeline or plan.",
        "Compare two versions of the same kind of document: two ODCS data contracts, two DTCS transformation contracts, two DPCS pipeline contracts, or two plans/pipelines.");
    CONTRACT_DOCUMENT_INVALID = ("ETL010", "contract-document-invalid", Load, Error,
        "A DTCS transformation contract or DPCS pipeline contract failed to parse or to validate.",
        "Fix the document; the message quotes the DTCS or DPCS validator (`etlantic generate dtcs|dpcs` writes valid ones).");
    BAD_BYTE_SIZE = ("ETL011", "bad-byte-size", Load, Error,
        "A size in bytes cannot be parsed.",
        "Write sizes as `<integer> <unit>` with unit B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024), e.g. `256 MB`.");

    // ---- structural ----
    DUPLICATE_ID = ("ETL101", "duplicate-id", Structural, Error,
        "Two nodes of the pipeline have the same id.",
        "Give every source, transformation and sink a unique id.");
    CYCLE = ("ETL102", "cycle", Structural, Error,
        "The pipeline graph has a cycle.",
        "A pipeline must be a directed acyclic graph; remove the edge that closes the loop.");
    EMPTY_PIPELINE = ("ETL103", "empty-pipeline", Structural, Error,
        "The pipeline has no source or no sink.",
        "Declare at least one source and one sink.");
    PORT_UNCONNECTED = ("ETL104", "port-unconnected", Structural, Error,
        "An input port of a transformation is not connected, or a port is connected that the transformation does not declare.",
        "Connect every declared input port to exactly one upstream node.");
    INVALID_ID = ("ETL105", "invalid-id", Structural, Error,
        "An id is empty or contains characters other than letters, digits, `_` and `-`.",
        "Use ids like `clean_orders`.");
    UNUSED_NODE = ("ETL106", "unused-node", Structural, Warning,
        "A source or transformation feeds nothing.",
        "Connect it to a sink or remove it; its data would be read and discarded.");
    IMPLEMENTATION_COUNT = ("ETL107", "implementation-count", Structural, Error,
        "A transformation must have exactly one implementation: `steps`, `plan`, `sql` or `impl`.",
        "Keep one of `steps`, `plan`, `sql` and `impl`.");
    SINK_AS_INPUT = ("ETL108", "sink-as-input", Structural, Error,
        "A node reads from a sink; sinks produce nothing.",
        "Read from the source or transformation that feeds the sink.");

    // ---- reference ----
    UNKNOWN_NODE = ("ETL201", "unknown-node", Reference, Error,
        "An input refers to a node that does not exist.",
        "Refer to the id of a source or a transformation declared in the pipeline.");
    UNKNOWN_ASSET = ("ETL202", "unknown-asset", Reference, Error,
        "A source or sink names a logical asset that is not declared.",
        "Declare the asset under `assets:` with its contract, or fix the name.");
    UNBOUND_ASSET = ("ETL203", "unbound-asset", Reference, Error,
        "A logical asset used by the pipeline is bound to no URI in the profile.",
        "Bind it under `bindings:` in the profile; an unbound asset is never silently discarded.");
    UNKNOWN_SCHEME = ("ETL204", "unknown-scheme", Reference, Error,
        "No registered source or sink plugin handles a binding's URI scheme.",
        "Use a scheme of a linked plugin (see `etlantic plugins`) or enable the cargo feature that provides it.");
    UNKNOWN_CONTRACT = ("ETL205", "unknown-contract", Reference, Error,
        "A contract reference does not resolve.",
        "Point `contract:` at an ODCS file relative to the pipeline file.");
    UNKNOWN_COLUMN = ("ETL206", "unknown-column", Reference, Error,
        "An expression or setting refers to a column that its input does not have.",
        "Use a column of the input contract; names are case-sensitive.");
    UNKNOWN_SECRET = ("ETL207", "unknown-secret", Reference, Error,
        "A secret reference cannot be resolved.",
        "Secrets are written `${env:NAME}`; set the environment variable before running.");
    UNKNOWN_PORT = ("ETL208", "unknown-port", Reference, Error,
        "A transform plan reads an input that the transformation does not declare.",
        "Name the plan's inputs after the transformation's input ports.");
    UNKNOWN_PARAMETER = ("ETL209", "unknown-parameter", Reference, Error,
        "A transform plan uses a runtime parameter that has no value.",
        "Give the value under `parameters:` of the transformation.");
    PLUGIN_CONFLICT = ("ETL210", "plugin-conflict", Reference, Error,
        "Two linked plugins claim the same URI scheme, backend name, transformation or processor name.",
        "Link only one of them: drop the cargo feature or crate of the other, or give one of them another name.");
    UNKNOWN_PROCESSOR = ("ETL220", "unknown-processor", Reference, Error,
        "A `process` step names a custom stateful processor that is not linked.",
        "Use the name of a linked processor (see `etlantic plugins`), or link the crate that registers it.");
    UNKNOWN_STATE_OPERATOR = ("ETL221", "unknown-state-operator", Reference, Error,
        "`state_ttl` in the profile names a transformation or operator that keeps no streaming state.",
        "Name a transformation with an aggregation, a deduplication, a join or a `process` step (or one of its operators, `<transformation>.<step>`).");
    UNKNOWN_QUALITY_RULE = ("ETL222", "unknown-quality-rule", Reference, Error,
        "`quality_policies` in the profile names a quality rule no contract of the pipeline has, or gives a rule a policy it cannot have.",
        "Rule ids are `<object>.<field>.range|length|pattern|unique` or `<object>[.<field>].<id or name>` (docs/streaming.md, Contract quality rules); `rowCount` and `sql` rules take `fail` or `warn` only.");
    QUALITY_RULE_NOT_EVALUATED = ("ETL223", "quality-rule-not-evaluated", Reference, Warning,
        "A quality rule of a contract is not evaluated by ETLantic (a `text` rule, a `custom` rule for another engine, an unknown metric).",
        "It is listed so that nothing is skipped silently; check it elsewhere, or express it as a library metric or a `sql` rule.");
    REDRIVE_REFUSED = ("ETL224", "redrive-refused", Reference, Error,
        "`etlantic dlq redrive` cannot replay quarantined records into this pipeline without losing or duplicating output: it is a batch pipeline, it keeps state (an aggregation, a deduplication, a `process` step), its logic is engine-specific, or it reads more than one stream.",
        "Redrive replays records through a stateless streaming pipeline with its own checkpoint. For a batch pipeline, fix the source and run it again (a batch run rewrites its outputs); for a stateful one, replay the fixed records through its source.");

    // ---- semantic / contracts ----
    PORT_TYPE_MISMATCH = ("ETL301", "port-type-mismatch", Semantic, Error,
        "The schema flowing into a port does not match the contract the port declares.",
        "Make the upstream output contract and the port contract agree (names, types, nullability), or add a projection/cast.");
    TYPE_MISMATCH = ("ETL302", "type-mismatch", Semantic, Error,
        "An expression is applied to values of the wrong type.",
        "Cast the operand, or compare values of the same type.");
    OUTPUT_CONTRACT_MISMATCH = ("ETL303", "output-contract-mismatch", Semantic, Error,
        "The schema a transformation produces does not match its declared output contract.",
        "Change the transformation or the output contract so that names and types agree.");
    UNSUPPORTED_TYPE = ("ETL304", "unsupported-type", Semantic, Error,
        "A contract uses a logical/physical type ETLantic cannot map to Arrow.",
        "Use one of the ODCS logical types (string, integer, number, boolean, date, timestamp, time, object, array) or a supported physicalType.");
    SINK_CONTRACT_MISMATCH = ("ETL305", "sink-contract-mismatch", Semantic, Error,
        "The schema a sink receives does not match the sink asset's contract.",
        "Project and cast to the sink contract before the sink.");
    UNKNOWN_FUNCTION = ("ETL306", "unknown-function", Semantic, Error,
        "An expression calls a function that is not in the DTCS function registry.",
        "Use a registered DTCS function; engine-specific logic belongs in a SQL step.");
    PROCESSOR_INVALID = ("ETL320", "processor-invalid", Semantic, Error,
        "A custom stateful processor rejected the keys, time mode or options of its `process` step.",
        "Fix the step as the message says; `etlantic plugins` lists the processors.");

    // ---- streaming ----
    APPEND_AGG_WITHOUT_WATERMARK = ("ETL401", "append-aggregation-without-watermark", Streaming, Error,
        "An aggregation on an unbounded input in append mode has no watermark on its event-time column.",
        "Declare a watermark on the source (event_time + watermark delay) and group by an event-time window, or use update/complete mode.");
    SESSION_WINDOW_UPDATE = ("ETL402", "session-window-update-mode", Streaming, Error,
        "Session window aggregation does not support update output mode on unbounded inputs.",
        "Use append mode (with a watermark) or complete mode.");
    COMPLETE_WITHOUT_AGGREGATION = ("ETL403", "complete-without-aggregation", Streaming, Error,
        "Complete output mode needs an aggregation.",
        "Use append mode, or add an aggregation.");
    UNSUPPORTED_STREAMING_OP = ("ETL404", "unsupported-streaming-operation", Streaming, Error,
        "An operation is not supported on unbounded inputs (e.g. sort without complete-mode aggregation, limit, global distinct without watermark).",
        "Move it after an aggregation in complete mode, or run the pipeline bounded.");
    CONTINUOUS_FALLBACK = ("ETL405", "continuous-trigger-fallback", Streaming, Warning,
        "The continuous trigger is not supported by the chosen backend; the micro-batch fallback is used.",
        "Use a processing-time trigger explicitly, or a backend that declares continuous processing.");
    BAD_WATERMARK = ("ETL406", "bad-watermark", Streaming, Error,
        "A watermark is declared on a column that is not a timestamp, or with a negative delay.",
        "Declare the watermark on a timestamp column of the source with a delay >= 0.");
    MULTIPLE_AGGREGATIONS = ("ETL407", "multiple-streaming-aggregations", Streaming, Error,
        "An aggregation whose rows feed another stateful step, in update or complete mode, cannot finalise them by the watermark (every operator but the last of a chain runs in append mode).",
        "Group the inner aggregation by a window or a watermarked event-time column (after a stream-stream join, one its time range bounds), or run the pipeline in batch mode.");
    SIDE_OUTPUT_UNKNOWN = ("ETL408", "late-side-output-unknown", Streaming, Error,
        "A late-event policy `side_output` names a sink that is not declared.",
        "Declare the side-output sink, or change the late policy.");
    UPDATE_MODE_UNSUPPORTED = ("ETL409", "update-mode-unsupported", Streaming, Error,
        "The output mode is not supported by this sink or this query shape.",
        "Pick an output mode the sink declares.");
    PROCESSOR_NEEDS_WATERMARK = ("ETL420", "processor-needs-watermark", Streaming, Error,
        "A `process` step with `time_mode: event_time` reads an input without a watermark, so its timers would never fire.",
        "Declare event_time and a watermark on the source, or use `time_mode: processing_time`.");
    STATE_TTL_DROPS_RESULTS = ("ETL421", "state-ttl-drops-results", Streaming, Error,
        "State TTL is declared for an aggregation in append mode, whose state the watermark already bounds: expiring it would drop results that were never emitted.",
        "Remove the `state_ttl` entry (the watermark evicts the state), or use update or complete mode.");
    OUTER_JOIN_WITHOUT_WATERMARK = ("ETL430", "outer-join-without-watermark", Streaming, Error,
        "An outer join of two streams cannot tell when a row will never match: it needs a watermark on the nullable side and an event-time range (`time_range`), or a watermarked event-time column among the join keys.",
        "Declare event_time and a watermark on both sources and add `time_range: {left, right, lower, upper}` to the join (Spark's rule for outer stream-stream joins).");
    UNBOUNDED_JOIN_STATE = ("ETL431", "unbounded-join-state", Streaming, Warning,
        "A stream-stream join keeps rows of one side that nothing evicts (that side or the other has no watermark, or the join has no time range): its state grows with the input.",
        "Declare watermarks on both sources and a `time_range` on the join, or bound the state with `state_ttl` in the profile; progress reports its size.");
    STATIC_SOURCE_MISUSE = ("ETL432", "static-source-misuse", Streaming, Error,
        "A static source (`static_refresh`) is used like a stream: it declares event time, a watermark, a late-event policy or a read limit, or a sink reads only static sources.",
        "A static source is a bounded table joined to a stream: drop the streaming settings, and join it with a streaming source before the sink.");
    STATE_INTERVAL_NEEDS_REPLAY = ("ETL433", "state-interval-needs-replay", Streaming, Error,
        "The profile sets `state_checkpoint_interval`, so a restart rebuilds the state by reading committed micro-batches again, which a source that is not replayable cannot give: the rebuilt state would miss their rows.",
        "Remove `state_checkpoint_interval` (the state is then written after every micro-batch), or bind the source to a replayable one.");
    STATE_STORE_UNKNOWN = ("ETL434", "state-store-unknown", Streaming, Error,
        "The profile's `state_store` names a state store that is not linked into this program.",
        "Use `state_store: memory` (the default) or `disk` (RocksDB, linked by the CLI's default `disk-state` feature and the `etlantic-rocksdb` crate).");
    STATE_STORE_UNSUPPORTED = ("ETL435", "state-store-unsupported", Streaming, Error,
        "An operator of the query cannot keep its state in the profile's `state_store` (every built-in operator can; an operator of a third-party engine may not).",
        "Run the query with `state_store: memory`, or move the operator to a query of its own.");
    LATENESS_WITHOUT_WATERMARK = ("ETL436", "allowed-lateness-without-watermark", Streaming, Error,
        "A window declares allowed lateness, but its event-time column has no watermark on an unbounded input: nothing is ever late and no window ever closes, so the lateness would mean nothing.",
        "Declare event_time and a watermark on the source the window's column comes from, or remove `allowed_lateness`.");

    // ---- capability ----
    BACKEND_UNSUPPORTED_ACTION = ("ETL501", "backend-unsupported-action", Capability, Error,
        "The chosen backend does not support an action, function or type that the transformation uses.",
        "Choose another backend for this step in the profile, or rewrite the step with supported operations.");
    NO_BACKEND = ("ETL502", "no-backend", Capability, Error,
        "No registered backend can execute a region.",
        "Enable the cargo feature of a backend that supports it, or change the profile's engine overrides.");
    SOURCE_NOT_STREAMABLE = ("ETL503", "source-not-streamable", Capability, Error,
        "A bounded-only source is used in a streaming run.",
        "Bind the asset to a streaming-capable source (directory, Kafka, rate) or run in batch mode.");
    SINK_MODE_UNSUPPORTED = ("ETL504", "sink-mode-unsupported", Capability, Error,
        "A sink does not support the requested write or output mode.",
        "Use a write mode the sink declares (see `etlantic plugins`).");
    FORMAT_UNSUPPORTED = ("ETL505", "format-unsupported", Capability, Error,
        "A file binding names a format that no plugin reads or writes.",
        "Use format=jsonl, csv or parquet, or a file extension that implies it.");
    REGION_LOCATION = ("ETL506", "region-location", Capability, Error,
        "A region is placed where its backend cannot run it (e.g. an SQL region with no database).",
        "Give the SQL region a database: read or write a postgres:// or sqlite:// asset in it, or name one under `sql_regions:` in the profile.");
    STREAMING_REGION_UNSUPPORTED = ("ETL507", "streaming-region-unsupported", Capability, Error,
        "The backend of a streaming region cannot give what the pipeline asks for: a late-event policy, quarantine of bad records, a source or sink it cannot read or write itself, or (for a backend that runs whole queries, like Spark) a region that holds only part of the query.",
        "Place every transformation of the streaming pipeline on that backend or none, use a late policy and `on_error` it declares (`etlantic plugins` lists them), or run the pipeline on the embedded runtime.");
    STATIC_SOURCE_UNBOUNDED = ("ETL530", "static-source-unbounded", Capability, Error,
        "A static source is bound to a plugin that cannot read it as a bounded table.",
        "Bind the static asset to a finite file or table (file://, delta://, sqlite://...), or make it a streaming source.");

    // ---- guarantee / policy ----
    GUARANTEE_UNMET = ("ETL601", "guarantee-unmet", Guarantee, Error,
        "The profile requires an end-to-end delivery guarantee that a source/sink pair cannot give.",
        "Use a replayable source and an idempotent or transactional sink, or lower `require_guarantee`.");
    SECRET_IN_PLAIN = ("ETL602", "secret-in-plain-text", Policy, Error,
        "A binding, endpoint or option holds a credential in plain text (a URI password, or an option named like a password, secret, token or key).",
        "Write `${secret:NAME}` there and map NAME under the profile's `secrets:` to `${env:VAR}` (or write `${env:VAR}` directly): the value is resolved at run time and never written to a plan, `explain`, progress records or logs.");
    QUARANTINE_UNBOUND = ("ETL603", "quarantine-unbound", Policy, Error,
        "Bad records are to be quarantined but the profile binds no quarantine output.",
        "Bind `quarantine:` in the profile (e.g. file://out/quarantine.jsonl) or set on_error: fail.");

    // ---- execution / data ----
    RECORD_UNPARSABLE = ("ETL701", "record-unparsable", Execution, Error,
        "A record could not be parsed.",
        "Fix the record at the reported source position; it was quarantined.");
    RECORD_TYPE_MISMATCH = ("ETL702", "record-type-mismatch", Execution, Error,
        "A field of a record has a value of the wrong type.",
        "Fix the value or the contract; the record was quarantined.");
    RECORD_MISSING_REQUIRED = ("ETL703", "record-missing-required", Execution, Error,
        "A required field of a record is missing or null.",
        "Provide the field or mark it `required: false` in the contract; the record was quarantined.");
    RECORD_RULE_VIOLATION = ("ETL704", "record-rule-violation", Execution, Error,
        "A record breaks a quality rule of its contract.",
        "Fix the record or the rule; the record was quarantined.");
    BAD_RECORDS_FAIL = ("ETL705", "bad-records-fail", Execution, Error,
        "The run failed because a record broke its contract and the policy is `fail`.",
        "Fix the input, or set on_error: quarantine to route bad records to the quarantine output.");
    IO_ERROR = ("ETL706", "io-error", Execution, Error,
        "Reading or writing data failed.",
        "Check the path or the connection in the binding, and permissions.");
    ENGINE_ERROR = ("ETL707", "engine-error", Execution, Error,
        "The execution engine reported an error.",
        "The message quotes the engine; if the plan validated, please report it.");
    LATE_EVENT = ("ETL708", "late-event", Execution, Warning,
        "An event arrived behind the watermark.",
        "It was handled by the source's late-event policy.");
    SINK_WRITE_FAILED = ("ETL709", "sink-write-failed", Execution, Error,
        "A sink failed to write or commit a batch.",
        "The batch is not committed and will be replayed on restart; check the sink's target.");
    ENGINE_UNREACHABLE = ("ETL710", "engine-unreachable", Execution, Error,
        "The engine a region runs on (such as a Spark Connect server) cannot be reached or started.",
        "Check the profile's endpoint (`sc://host:port`) and that the server runs; for a local Spark, run `cargo xtask setup` (it installs pyspark) or set SPARK_HOME.");
    CONNECTOR_MISSING = ("ETL711", "connector-missing", Execution, Error,
        "The engine a region runs on lacks the connector a source or sink needs (such as Spark without its Kafka or Delta jars).",
        "Add the connector to the cluster (for Spark, its `spark.jars.packages` or jars directory), or bind the asset to a format the cluster reads.");
    SOURCE_DATA_LOST = ("ETL712", "source-data-lost", Execution, Error,
        "Records the query had yet to read are gone from the source (deleted by retention, or the log was truncated).",
        "Nothing was read past the gap. Raise the source's retention or run the query more often; to go on without the lost records, set the binding's `failOnDataLoss=false` (each loss is then recorded in the progress and the run report).");
    SOURCE_FILE_CHANGED = ("ETL713", "source-file-changed", Execution, Error,
        "A source file changed (appended, truncated or replaced) after the stream picked it up, so a replay would read other bytes than the first read.",
        "Write source files elsewhere and move them into the directory when complete (files named with a leading `.` or `_` are ignored until renamed); to go on, quarantine the changed file (`on_error: quarantine`) or restore it.");

    STORAGE_NOT_FOUND = ("ETL714", "storage-not-found", Execution, Error,
        "An object-store location names a bucket (or container) that does not exist.",
        "Create the bucket, or fix the location's bucket name; the endpoint and region come from the profile's storage_options or the AWS_* environment variables.");
    STORAGE_DENIED = ("ETL715", "storage-denied", Execution, Error,
        "The object store refused the credentials, or they lack a permission the location needs.",
        "Check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or the profile's storage_options with ${secret:...}) and that they may list, read, write and delete under the location.");
    STORAGE_UNREACHABLE = ("ETL716", "storage-unreachable", Execution, Error,
        "The object store's endpoint cannot be reached (after retrying transient failures).",
        "Check the endpoint (AWS_ENDPOINT_URL or storage_options.endpoint), the network, and AWS_ALLOW_HTTP for a plain-http endpoint.");
    STORAGE_UNSUPPORTED = ("ETL717", "storage-unsupported", Execution, Error,
        "The object store lacks an operation the location needs: conditional creates (If-None-Match) for a checkpoint or a sink's log.",
        "Use a store that honours If-None-Match on PUT (AWS S3, MinIO, Ceph RGW, Cloudflare R2, moto); without it two writers could both commit a micro-batch.");

    // ---- checkpoint ----
    CHECKPOINT_CORRUPT = ("ETL801", "checkpoint-corrupt", Checkpoint, Error,
        "A checkpoint file cannot be read.",
        "Restore the checkpoint directory from a backup, or start with a new checkpoint location.");
    CHECKPOINT_INCOMPATIBLE = ("ETL802", "checkpoint-incompatible-plan", Checkpoint, Error,
        "A restart uses a plan that is incompatible with the checkpoint.",
        "Run the plan that wrote the checkpoint, or start with a new checkpoint location.");
    CHECKPOINT_LOCKED = ("ETL803", "checkpoint-locked", Checkpoint, Error,
        "Another query is using the checkpoint location.",
        "Stop the other query, or use another checkpoint location.");
    STATE_STORE_CHANGED = ("ETL804", "state-store-changed", Checkpoint, Error,
        "The checkpoint's state was written by another state store than the profile's `state_store` names; a store cannot read another's state.",
        "Set `state_store` back to the store that wrote the checkpoint, or start the query on a new checkpoint location.");

    // ---- planning / plans ----
    PLAN_INVALID = ("ETL901", "plan-invalid", Planning, Error,
        "A PipelinePlan file cannot be read or its fingerprint does not match its content.",
        "Produce the plan again with `etlantic plan`; do not edit plan files by hand.");
    PLANNING_FAILED = ("ETL902", "planning-failed", Planning, Error,
        "The planner could not place a step in any region.",
        "See the other diagnostics; the step needs a backend that supports it.");
    PLAN_TOO_NEW = ("ETL903", "plan-version", Planning, Error,
        "A PipelinePlan was written by an incompatible version of ETLantic.",
        "Plan the pipeline again with this version.");
}

/// Looks a code up by its string.
pub fn lookup(code: &str) -> Option<&'static CodeInfo> {
    ALL.iter().find(|c| c.code == code)
}

/// The catalogue as Markdown (the content of `docs/diagnostics.md`).
pub fn catalogue_markdown() -> String {
    let mut out = String::from(
        "# Diagnostic codes\n\n\
         Generated from `etlantic_core::diagnostics::codes` (`cargo xtask docs` rewrites this file; \
         a test fails when it is stale). Codes are stable: a code never changes meaning.\n\n\
         | code | name | phase | severity | meaning | hint |\n|---|---|---|---|---|---|\n",
    );
    for c in ALL {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} | {} |\n",
            c.code,
            c.name,
            c.phase.as_str(),
            c.severity.as_str(),
            c.title,
            c.help.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn diagnostics_doc_is_current() {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/diagnostics.md");
        let want = catalogue_markdown();
        if std::env::var_os("ETLANTIC_UPDATE_DOCS").is_some() {
            std::fs::write(&path, &want).unwrap();
        }
        let have = std::fs::read_to_string(&path).unwrap_or_default();
        assert!(
            have == want,
            "docs/diagnostics.md is stale: run `cargo xtask docs`"
        );
    }

    #[test]
    fn codes_are_unique_and_sorted() {
        let mut seen = HashSet::new();
        let mut prev = "";
        for c in ALL {
            assert!(seen.insert(c.code), "duplicate code {}", c.code);
            assert!(c.code > prev, "{} out of order", c.code);
            prev = c.code;
            assert!(c.code.starts_with("ETL") && c.code.len() == 6);
            assert!(!c.help.is_empty() && !c.title.is_empty());
        }
    }
}

//! The source kit: checks a [`SourceProvider`] against the invariants of
//! [`etlantic_core::plugin::Source`], on data the author's [`SourceHarness`] appends.
//!
//! The records are the kit's events (`id` long, `name` string, `ts` timestamp; see
//! [`EVENTS_CONTRACT`]). The checks, in order, each a named [`Check`] of the report:
//!
//! 1. `capabilities`: the provider answers from the binding alone and can be read
//!    incrementally (`unbounded`);
//! 2. `schema`: the source's schema is the contract's, before and after reads, and every
//!    batch it returns has exactly that schema;
//! 3. `empty`: with nothing appended, `latest_offset(None)` is `None`;
//! 4. `read`: the appended records come back, each once, in a range `(None, end]`;
//! 5. `nothing_new`: `latest_offset(end)` is `end` while nothing is appended;
//! 6. `offsets_json`: offsets survive a JSON round trip unchanged;
//! 7. `replay` (replayable sources): the same range read twice, and by a new instance
//!    (a restart) given the round-tripped offsets, returns the same records;
//! 8. `next_range`: records appended later come in `(end, end2]`, none of the first
//!    range again;
//! 9. `read_limit`: with `max_records: 1`, the source advances in ranges that together
//!    hold every record once, each range at most one of the source's own batches wide
//!    (it must make progress: no empty range);
//! 10. `rejects` (when the harness can append a malformed record): the record comes back
//!     in `rejected` with the asset in its position and its raw text, the good records of
//!     the range still in the batches;
//! 11. `commit`: `commit(end)` twice is fine, and a new instance resumes at `end`.

use super::{io, KitReport};
use arrow::array::RecordBatch;
use etlantic_core::async_trait;
use etlantic_core::contract::Contract;
use etlantic_core::data::Offset;
use etlantic_core::diagnostics::Result;
use etlantic_core::guarantee::SourceGuarantee;
use etlantic_core::plugin::{ReadLimit, SourceBatch, SourceContext, SourceProvider};
use etlantic_core::streaming::ExecutionMode;
use etlantic_core::uri::BindingUri;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The contract of the kit's records (ODCS YAML): `id` (long), `name` (string), `ts`
/// (timestamp).
pub const EVENTS_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "kit_events"
name: "kit_events"
status: "active"
schema:
  - name: "kit_events"
    logicalType: "object"
    properties:
      - name: "id"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
      - name: "name"
        logicalType: "string"
      - name: "ts"
        logicalType: "timestamp"
"#;

/// The kit's record number `id`: `{id, name: "n<id % 3>", ts: 2024-01-01T00:00:<id>Z}`.
pub fn event(id: i64) -> Value {
    json!({
        "id": id,
        "name": format!("n{}", id % 3),
        "ts": format!("2024-01-01T00:{:02}:{:02}Z", id / 60, id % 60),
    })
}

/// The schema of the kit's records.
pub fn events_schema() -> arrow::datatypes::SchemaRef {
    Contract::parse(EVENTS_CONTRACT, "kit_events.yaml", None)
        .expect("the kit's contract parses")
        .arrow_schema()
}

/// What the kit needs from a source's author: somewhere to append records that the
/// source under test then reads.
#[async_trait]
pub trait SourceHarness: Send {
    /// The binding of the source under test, reading what [`SourceHarness::append`]
    /// appends (a fresh, empty place: a new stream, topic, directory).
    fn binding(&self) -> String;
    /// Appends records (JSON objects of the kit's columns, see [`event`]) where the
    /// source reads, in this order.
    async fn append(&mut self, records: &[Value]) -> Result<()>;
    /// Appends a record the source cannot decode (`raw` is not a JSON object of the
    /// kit's columns). Returns `false` when the source has no such thing (e.g. it reads
    /// typed rows), and the `rejects` check is skipped.
    async fn append_malformed(&mut self, _raw: &str) -> Result<bool> {
        Ok(false)
    }
}

/// Checks `provider` with the records `harness` appends; `dir` is a scratch directory
/// (the project root and the sources' checkpoint directory).
pub async fn check_source(
    provider: &'static dyn SourceProvider,
    harness: &mut dyn SourceHarness,
    dir: &Path,
) -> KitReport {
    let mut report = KitReport::new(format!("source `{}`", provider.scheme()));
    if let Err(e) = run(provider, harness, dir, &mut report).await {
        report.fail("kit", format!("stopped: {e}"));
    }
    report
}

struct Opened {
    ctx: SourceContext,
    guarantee: SourceGuarantee,
}

fn context(uri: BindingUri, dir: &Path) -> Result<SourceContext> {
    let contract = Contract::parse(EVENTS_CONTRACT, "kit_events.yaml", None)?;
    let state_dir: PathBuf = dir.join("checkpoint/sources/0");
    std::fs::create_dir_all(&state_dir).map_err(io)?;
    Ok(SourceContext {
        asset: "kit_events".into(),
        uri,
        schema: contract.arrow_schema(),
        contract: Some(Arc::new(contract)),
        root: dir.to_path_buf(),
        mode: ExecutionMode::Streaming,
        state: Some(etlantic_core::storage::open(&state_dir)),
        storage_options: Default::default(),
    })
}

async fn run(
    provider: &'static dyn SourceProvider,
    harness: &mut dyn SourceHarness,
    dir: &Path,
    report: &mut KitReport,
) -> Result<()> {
    let uri = BindingUri::parse(&harness.binding())?;
    let caps = provider.capabilities(&uri)?;
    report.check(
        "capabilities",
        caps.unbounded,
        "the source declares it cannot be read incrementally (`unbounded: false`): the streaming checks need it",
    );
    if !caps.unbounded {
        return Ok(());
    }
    let opened = Opened {
        ctx: context(uri, dir)?,
        guarantee: caps.guarantee,
    };
    let mut source = provider.create(opened.ctx.clone())?;
    let schema = opened.ctx.schema.clone();
    report.check(
        "schema",
        source.schema() == schema,
        format!(
            "schema() is {:?}, the contract's is {schema:?}",
            source.schema()
        ),
    );

    // Empty.
    let none = source.latest_offset(None, &ReadLimit::unlimited()).await?;
    report.check(
        "empty",
        none.is_none(),
        format!("nothing appended yet, latest_offset(None) is {none:?}"),
    );

    // First range.
    let first: Vec<Value> = (0..5).map(event).collect();
    harness.append(&first).await?;
    let Some(end) = source.latest_offset(None, &ReadLimit::unlimited()).await? else {
        report.fail(
            "read",
            "5 records appended, latest_offset(None) is still None",
        );
        return Ok(());
    };
    let batch = source.read(None, &end).await?;
    check_batches(report, &batch, &schema);
    report.check_rows("read", &ids(&batch), &[0, 1, 2, 3, 4]);
    let again = source
        .latest_offset(Some(&end), &ReadLimit::unlimited())
        .await?;
    report.check(
        "nothing_new",
        again.as_ref() == Some(&end),
        format!("nothing new after {end:?}, latest_offset is {again:?}"),
    );

    // Offsets as JSON, and a replay by this instance and a new one.
    let text = serde_json::to_string(&end).expect("offsets are JSON");
    let parsed: Offset = serde_json::from_str(&text).expect("offsets are JSON");
    report.check(
        "offsets_json",
        parsed == end,
        format!("{end:?} reads back from JSON as {parsed:?}"),
    );
    if opened.guarantee == SourceGuarantee::Replayable {
        let twice = source.read(None, &end).await?;
        let mut restarted = provider.create(opened.ctx.clone())?;
        let after_restart = restarted.read(None, &parsed).await?;
        let same = ids(&twice) == ids(&batch) && ids(&after_restart) == ids(&batch);
        report.check(
            "replay",
            same,
            format!(
                "(None, end] read {:?}, again {:?}, by a new instance {:?}",
                ids(&batch),
                ids(&twice),
                ids(&after_restart)
            ),
        );
    }

    // The next range holds only the new records.
    let second: Vec<Value> = (5..8).map(event).collect();
    harness.append(&second).await?;
    let Some(end2) = source
        .latest_offset(Some(&end), &ReadLimit::unlimited())
        .await?
    else {
        report.fail(
            "next_range",
            "3 more records appended, latest_offset is None",
        );
        return Ok(());
    };
    let next = source.read(Some(&end), &end2).await?;
    check_batches(report, &next, &schema);
    report.check_rows("next_range", &ids(&next), &[5, 6, 7]);

    // A read limit: small ranges that together hold every record once.
    let third: Vec<Value> = (8..12).map(event).collect();
    harness.append(&third).await?;
    let limit = ReadLimit {
        max_files: None,
        max_records: Some(1),
    };
    let mut at = end2.clone();
    let mut seen = Vec::new();
    let mut steps = 0;
    while steps < 20 {
        let Some(next_end) = source.latest_offset(Some(&at), &limit).await? else {
            break;
        };
        if next_end == at {
            break;
        }
        let part = source.read(Some(&at), &next_end).await?;
        if part.num_rows() == 0 && part.rejected.is_empty() {
            report.fail(
                "read_limit",
                format!("the range ({at:?}, {next_end:?}] is empty"),
            );
            break;
        }
        seen.extend(ids(&part));
        at = next_end;
        steps += 1;
    }
    report.check_rows("read_limit", &seen, &[8, 9, 10, 11]);

    // A malformed record is returned, with its position.
    if harness.append_malformed("{not json").await? {
        harness.append(&[event(12)]).await?;
        let end4 = source
            .latest_offset(Some(&at), &ReadLimit::unlimited())
            .await?;
        match end4 {
            Some(end4) if end4 != at => {
                let part = source.read(Some(&at), &end4).await?;
                let rejected = &part.rejected;
                let ok = rejected.len() == 1
                    && rejected[0].raw.contains("not json")
                    && rejected[0].position.asset == "kit_events"
                    && ids(&part) == [12];
                report.check(
                    "rejects",
                    ok,
                    format!(
                        "expected one rejected record with raw text and position, and record 12; got rows {:?}, rejected {rejected:?}",
                        ids(&part)
                    ),
                );
                at = end4;
            }
            other => report.fail(
                "rejects",
                format!("a malformed and a good record appended, latest_offset is {other:?}"),
            ),
        }
    }

    // Commit, twice, and a restart resumes there.
    source.commit(&at).await?;
    source.commit(&at).await?;
    let mut restarted = provider.create(opened.ctx.clone())?;
    let resumed = restarted
        .latest_offset(Some(&at), &ReadLimit::unlimited())
        .await?;
    report.check(
        "commit",
        resumed.as_ref() == Some(&at),
        format!("after commit({at:?}), a new instance's latest_offset is {resumed:?}"),
    );
    report.check(
        "schema",
        source.schema() == schema && restarted.schema() == schema,
        "the schema changed after reads",
    );
    Ok(())
}

fn check_batches(
    report: &mut KitReport,
    batch: &SourceBatch,
    schema: &arrow::datatypes::SchemaRef,
) {
    for b in &batch.batches {
        if b.schema() != *schema {
            report.fail(
                "schema",
                format!(
                    "a batch has schema {:?}, not the source's {schema:?}",
                    b.schema()
                ),
            );
        }
    }
}

/// The `id` column of every batch, in order.
fn ids(batch: &SourceBatch) -> Vec<i64> {
    batch.batches.iter().flat_map(ids_of).collect()
}

fn ids_of(b: &RecordBatch) -> Vec<i64> {
    let Some(c) = b.column_by_name("id") else {
        return vec![];
    };
    let c = arrow::compute::cast(c, &arrow::datatypes::DataType::Int64).expect("ids cast");
    let c = c
        .as_any()
        .downcast_ref::<arrow::array::Int64Array>()
        .expect("Int64");
    c.iter().flatten().collect()
}

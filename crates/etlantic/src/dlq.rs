//! `etlantic dlq`: inspecting the quarantine (dead-letter) output.
//!
//! The quarantine is a JSON-lines file (see [`etlantic_runtime::quarantine`]); each line
//! names its code, reason, field, source position, raw record, run, and in streaming runs
//! the query and micro-batch. [`summarise`] groups the lines by query, batch, code and
//! the quality rules their reasons name; [`select`] filters them for `dlq show`.

use etlantic_core::diagnostics::Result;
use etlantic_core::profile::resolve_secrets;
use etlantic_core::storage::{Location, StorageOptions};
use etlantic_plan::Project;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// The quarantine a project's profile names: a file (relative paths resolve against the
/// project directory) or an object-store prefix.
pub fn quarantine_location(project: &Project) -> Result<Location> {
    let uri = resolve_secrets(project.profile.quarantine_uri(), &project.profile)?;
    etlantic_runtime::quarantine::quarantine_location(&uri, &project.root)
}

/// The profile's `storage_options`, secrets resolved: how to reach a quarantine on an
/// object store.
pub fn storage_options(project: &Project) -> Result<StorageOptions> {
    project
        .profile
        .storage_options
        .iter()
        .map(|(k, v)| Ok((k.clone(), resolve_secrets(v, &project.profile)?)))
        .collect::<Result<std::collections::BTreeMap<_, _>>>()
        .map(StorageOptions::new)
}

/// The quarantine's lines; an absent file (or empty prefix) has none.
pub fn read(location: &Location, options: &StorageOptions) -> Result<Vec<Value>> {
    etlantic_runtime::quarantine::read_quarantine_at(location, options)
}

/// The lines of the quarantine a project's profile names.
pub fn read_project(project: &Project) -> Result<Vec<Value>> {
    read(&quarantine_location(project)?, &storage_options(project)?)
}

/// The quality rule ids a line's reason names (`rule `<id>``), in order.
pub fn rules_of(line: &Value) -> Vec<String> {
    let reason = line["reason"].as_str().unwrap_or_default();
    reason
        .split("rule `")
        .skip(1)
        .filter_map(|rest| rest.split_once('`').map(|(id, _)| id.to_string()))
        .collect()
}

/// One group of quarantined records.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Group {
    /// The streaming query (`None` for batch runs).
    pub query_id: Option<String>,
    /// The micro-batch (`None` for batch runs).
    pub batch_id: Option<u64>,
    /// The diagnostic code (`ETL701` unparsable, `ETL704` rule, `ETL708` late, ...).
    pub code: String,
    /// The quality rules named, joined with `+` (empty when none).
    pub rules: String,
    /// How many records.
    pub records: u64,
}

/// Groups `lines` by query, batch, code and rules.
pub fn summarise(lines: &[Value]) -> Vec<Group> {
    let mut counts: BTreeMap<(Option<String>, Option<u64>, String, String), u64> = BTreeMap::new();
    for l in lines {
        let key = (
            l["query_id"].as_str().map(String::from),
            l["batch_id"].as_u64(),
            l["code"].as_str().unwrap_or("?").to_string(),
            rules_of(l).join("+"),
        );
        *counts.entry(key).or_insert(0) += 1;
    }
    counts
        .into_iter()
        .map(|((query_id, batch_id, code, rules), records)| Group {
            query_id,
            batch_id,
            code,
            rules,
            records,
        })
        .collect()
}

/// What `dlq show` keeps.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Only this code.
    pub code: Option<String>,
    /// Only records a reason ties to this quality rule.
    pub rule: Option<String>,
    /// Only this micro-batch.
    pub batch: Option<u64>,
}

/// The lines `filter` keeps, in file order.
pub fn select<'a>(lines: &'a [Value], filter: &Filter) -> Vec<&'a Value> {
    lines
        .iter()
        .filter(|l| {
            filter
                .code
                .as_ref()
                .is_none_or(|c| l["code"].as_str() == Some(c.as_str()))
                && filter
                    .rule
                    .as_ref()
                    .is_none_or(|r| rules_of(l).iter().any(|x| x == r))
                && filter
                    .batch
                    .is_none_or(|b| l["batch_id"].as_u64() == Some(b))
        })
        .collect()
}

/// `summarise` as an aligned text table.
pub fn render_summary(groups: &[Group]) -> String {
    let mut out = String::from("query\tbatch\tcode\trules\trecords\n");
    for g in groups {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\n",
            g.query_id.as_deref().unwrap_or("-"),
            g.batch_id.map_or("-".to_string(), |b| b.to_string()),
            g.code,
            if g.rules.is_empty() { "-" } else { &g.rules },
            g.records
        ));
    }
    let total: u64 = groups.iter().map(|g| g.records).sum();
    out.push_str(&format!("{total} record(s)\n"));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lines() -> Vec<Value> {
        vec![
            json!({"code": "ETL701", "reason": "not JSON", "query_id": "q", "batch_id": 0}),
            json!({"code": "ETL704", "reason": "rule `o.user.known` (must be one of [\"a\"]): user=z", "query_id": "q", "batch_id": 1}),
            json!({"code": "ETL704", "reason": "rule `o.amount.range` (must be <= 5): amount=9; rule `o.id.unique` ((id) must be unique): id=1", "query_id": "q", "batch_id": 1}),
            json!({"code": "ETL704", "reason": "rule `o.user.known` (must be one of [\"a\"]): user=y", "query_id": "q", "batch_id": 1}),
            json!({"code": "ETL702", "reason": "field `ts`: bad", "batch_id": null}),
        ]
    }

    #[test]
    fn groups_by_query_batch_code_and_rules() {
        let g = summarise(&lines());
        assert_eq!(g.len(), 4);
        let known = g.iter().find(|g| g.rules == "o.user.known").unwrap();
        assert_eq!((known.batch_id, known.records), (Some(1), 2));
        assert!(g.iter().any(|g| g.rules == "o.amount.range+o.id.unique"));
        let batchless = g.iter().find(|g| g.code == "ETL702").unwrap();
        assert_eq!(
            (batchless.query_id.as_deref(), batchless.batch_id),
            (None, None)
        );
        assert!(render_summary(&g).ends_with("5 record(s)\n"));
    }

    #[test]
    fn filters_by_code_rule_and_batch() {
        let l = lines();
        let by_rule = select(
            &l,
            &Filter {
                rule: Some("o.id.unique".into()),
                ..Filter::default()
            },
        );
        assert_eq!(by_rule.len(), 1);
        let by_batch = select(
            &l,
            &Filter {
                code: Some("ETL704".into()),
                batch: Some(1),
                ..Filter::default()
            },
        );
        assert_eq!(by_batch.len(), 3);
        assert_eq!(select(&l, &Filter::default()).len(), 5);
    }
}

/// What `dlq redrive` did.
#[derive(Clone, Debug, Serialize)]
pub struct RedriveReport {
    /// The source whose quarantined records were replayed.
    pub source: String,
    /// Records replayed in this redrive.
    pub replayed: u64,
    /// Matching records an earlier redrive already replayed (skipped).
    pub already_redriven: u64,
    /// Matching records whose raw text is not a JSON object (a CSV line, a non-JSON
    /// message), which cannot be replayed.
    pub not_replayable: u64,
    /// The redrive's id: a digest of the records it replays, so that a redrive that was
    /// interrupted resumes from its own checkpoint instead of replaying twice.
    pub redrive_id: Option<String>,
    /// The streaming run over the replayed records (its quarantine has what failed again).
    pub run: Option<crate::run::RunReport>,
}

/// The directory of the quarantine (a file, or an object-store prefix) and the name of
/// its ledger in it, `<quarantine name>.redriven`: the records already redriven.
fn ledger_of(quarantine: &Location) -> (Location, String) {
    let (dir, name) = quarantine.parent_and_name();
    (dir, format!("{name}.redriven"))
}

/// A location as a profile writes it.
fn uri_of(location: &Location) -> String {
    match location {
        Location::Local(path) => format!("file://{}", path.display()),
        Location::Remote(url) => url.to_string(),
    }
}

/// The identity of a quarantined record: what the runtime writes for it, without the run.
fn record_key(line: &Value) -> String {
    serde_json::json!([
        line["query_id"],
        line["batch_id"],
        line["code"],
        line["reason"],
        line["field"],
        line["position"],
        line["raw"]
    ])
    .to_string()
}

fn refused(message: String) -> etlantic_core::Error {
    etlantic_core::Error::new(&etlantic_core::diagnostics::codes::REDRIVE_REFUSED, message)
}

/// Replays the quarantined records of `source` (default: the pipeline's only streaming
/// source) that `filter` keeps into the pipeline, after a fix to the contract, the
/// pipeline or the data's producer.
///
/// The records (their raw JSON) become the input of a streaming run of the same pipeline
/// with trigger `available_now`, the source rebound to them and its own checkpoint under
/// `<quarantine dir>/redrive/<id>/` (beside the quarantine, on its disk or object store);
/// the sinks append what passes, and what fails again is
/// quarantined again (with the redrive file as its position). Nothing is replayed twice:
/// the records of a finished redrive are listed in the ledger beside the quarantine
/// (`<quarantine>.redriven`) and skipped next time,
/// and an interrupted redrive of the same records has the same id and resumes from its
/// checkpoint, whose exactly-once sinks write nothing twice.
///
/// Refused (`ETL224`) for batch pipelines (a batch run rewrites its outputs: run it again),
/// stateful ones (a replay would start from empty state and emit partial results), logic
/// that is not portable, and pipelines that read another stream.
pub async fn redrive(
    project: &Project,
    source: Option<&str>,
    filter: &Filter,
) -> Result<RedriveReport> {
    use etlantic_core::streaming::{ExecutionMode, Trigger};
    let base = etlantic_plan::plan(project).into_result()?;
    if base.profile.mode != ExecutionMode::Streaming {
        return Err(refused(
            "this is a batch pipeline: fix the source and run it again (a batch run rewrites its outputs)".into(),
        ));
    }
    let streams: Vec<&etlantic_plan::plan::PlanSource> = base
        .sources
        .iter()
        .filter(|s| s.static_refresh.is_none())
        .collect();
    let target = match source {
        Some(id) => base
            .sources
            .iter()
            .find(|s| s.id == id)
            .ok_or_else(|| refused(format!("the pipeline has no source `{id}`")))?,
        None if streams.len() == 1 => streams[0],
        None => {
            return Err(refused(
                "name the source to redrive (`--source`): the pipeline reads several".into(),
            ))
        }
    };
    if streams.iter().any(|s| s.id != target.id) {
        return Err(refused(format!(
            "the pipeline reads another stream besides `{}`, which a redrive would read again from its start",
            target.id
        )));
    }
    for t in &base.transforms {
        let stateful = match &t.logic {
            etlantic_plan::plan::PlanLogic::Portable { plan, .. } => {
                let tp = etlantic_core::ir::TransformPlan::from_value(plan, &t.id)?;
                tp.decoded().steps.iter().any(|s| s.op.is_stateful())
            }
            _ => {
                return Err(refused(format!(
                    "transformation `{}` is not a portable plan, so it cannot be checked to keep no state",
                    t.id
                )))
            }
        };
        if stateful {
            return Err(refused(format!(
                "transformation `{}` keeps state (an aggregation, a deduplication or a `process` step); replayed records would start from empty state",
                t.id
            )));
        }
    }

    let quarantine = quarantine_location(project)?;
    let options = storage_options(project)?;
    let lines = read(&quarantine, &options)?;
    // The ledger, the replayed records and the replay's checkpoint live beside the
    // quarantine: on the local disk or on its object store.
    let (beside, ledger) = ledger_of(&quarantine);
    let beside_storage = etlantic_core::storage::open_location(&beside, &options)?;
    let done: std::collections::HashSet<String> = match beside_storage.read(&ledger)? {
        Some(bytes) => String::from_utf8_lossy(&bytes)
            .lines()
            .map(String::from)
            .collect(),
        None => Default::default(),
    };
    let mut report = RedriveReport {
        source: target.id.clone(),
        replayed: 0,
        already_redriven: 0,
        not_replayable: 0,
        redrive_id: None,
        run: None,
    };
    let mut keys = Vec::new();
    let mut records = String::new();
    for l in select(&lines, filter) {
        if l["position"]["asset"].as_str() != Some(target.asset.as_str()) {
            continue;
        }
        let key = etlantic_core::canonical::sha256_hex(record_key(l).as_bytes());
        if done.contains(&key) {
            report.already_redriven += 1;
            continue;
        }
        let raw = l["raw"].as_str().unwrap_or_default();
        match serde_json::from_str::<Value>(raw) {
            Ok(v) if v.is_object() => {
                records.push_str(&v.to_string());
                records.push('\n');
                keys.push(key);
            }
            _ => report.not_replayable += 1,
        }
    }
    if keys.is_empty() {
        return Ok(report);
    }
    let digest = etlantic_core::canonical::sha256_hex(keys.join("\n").as_bytes());
    let id = digest.trim_start_matches("sha256:")[..16].to_string();
    let dir = beside.join("redrive").join(&id);
    let input = dir.join("in");
    etlantic_core::storage::put_bytes(
        etlantic_core::storage::open_location(&input, &options)?.as_ref(),
        "records.jsonl",
        records.as_bytes(),
    )?;

    let mut replay = project.clone();
    replay.profile.trigger = Some(Trigger::AvailableNow);
    replay.profile.checkpoint = Some(uri_of(&dir.join("checkpoint")));
    replay.profile.bindings.insert(
        target.asset.clone(),
        format!("{}?format=jsonl", uri_of(&input)),
    );
    let plan = etlantic_plan::plan(&replay).into_result()?;
    let ctx = crate::run::RunContext::for_plan(&plan, &project.root);
    let run = crate::run::run_streaming(
        &plan,
        &ctx,
        crate::run::StreamingRun {
            on_progress: None,
            stop: Default::default(),
            max_batches: None,
            metrics_addr: None,
            progress: None,
        },
    )
    .await;
    let ok = run.status == "succeeded";
    report.redrive_id = Some(id);
    report.run = Some(run);
    if ok {
        report.replayed = keys.len() as u64;
        let mut all: Vec<String> = done.into_iter().collect();
        all.extend(keys);
        all.sort();
        etlantic_core::storage::put_bytes(
            beside_storage.as_ref(),
            &ledger,
            (all.join("\n") + "\n").as_bytes(),
        )?;
    }
    Ok(report)
}

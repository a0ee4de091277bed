//! `etlantic dlq`: inspecting the quarantine (dead-letter) output.
//!
//! The quarantine is a JSON-lines file (see [`etlantic_sinks::quarantine`]); each line
//! names its code, reason, field, source position, raw record, run, and in streaming runs
//! the query and micro-batch. [`summarise`] groups the lines by query, batch, code and
//! the quality rules their reasons name; [`select`] filters them for `dlq show`.

use etlantic_core::diagnostics::Result;
use etlantic_core::uri::BindingUri;
use etlantic_plan::Project;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The quarantine file a project's profile names (relative paths resolve against the
/// project directory).
pub fn quarantine_file(project: &Project) -> Result<PathBuf> {
    let uri = BindingUri::parse(project.profile.quarantine_uri())?;
    let path = PathBuf::from(&uri.location);
    Ok(if path.is_absolute() {
        path
    } else {
        project.root.join(path)
    })
}

/// The quarantine's lines; an absent file has none.
pub fn read(path: &Path) -> Result<Vec<Value>> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    etlantic_sinks::quarantine::read_quarantine(path)
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

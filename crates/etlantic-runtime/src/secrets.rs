//! Keeping secrets out of everything a run writes or reports.
//!
//! A binding may carry a secret (`postgres://app:${secret:pg}@db/x`) or place a path by
//! one (`file://data/${env:TENANT}/orders.jsonl`); once resolved, the value can reach a
//! record's position, an I/O error's message or a diagnostic's help. A [`Scrubber`] knows
//! every resolved value a plan references and replaces each with `***` wherever the
//! runtime writes text: quarantine lines, diagnostics, run reports.

use etlantic_core::data::RejectedRecord;
use etlantic_core::diagnostics::{Diagnostic, Error, Result};
use etlantic_plan::plan::PipelinePlan;
use std::sync::Arc;

/// Resolves the `${...}` references of a binding, location or option text.
pub type SecretResolver = Arc<dyn Fn(&str) -> Result<String> + Send + Sync>;

/// The resolved values of every secret a plan references, longest first (a value that
/// contains another is replaced whole).
#[derive(Clone, Debug, Default)]
pub struct Scrubber(Vec<String>);

impl Scrubber {
    /// The scrubber of `plan`'s bindings, quarantine, checkpoint, secrets table, storage
    /// options and region locations, resolved with `resolve`. A reference that does not resolve is
    /// skipped: the run fails on it where it is used, and it has no value to leak.
    pub fn for_plan(plan: &PipelinePlan, resolve: &dyn Fn(&str) -> Result<String>) -> Self {
        let mut texts: Vec<&str> = plan.assets.values().map(|a| a.binding.as_str()).collect();
        texts.push(&plan.profile.quarantine);
        texts.extend(plan.profile.checkpoint.as_deref());
        texts.extend(plan.profile.secrets.values().map(String::as_str));
        texts.extend(plan.profile.storage_options.values().map(String::as_str));
        texts.extend(plan.regions.iter().filter_map(|r| r.location.as_deref()));
        let mut values: Vec<String> = Vec::new();
        for text in texts {
            let mut rest = text;
            while let Some(start) = rest.find("${") {
                let after = &rest[start..];
                let Some(end) = after.find('}') else { break };
                if let Ok(v) = resolve(&after[..=end]) {
                    if !v.is_empty() && !values.contains(&v) {
                        values.push(v);
                    }
                }
                rest = &after[end + 1..];
            }
        }
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        Scrubber(values)
    }

    /// `s` with every secret value replaced by `***`.
    pub fn text(&self, s: &str) -> String {
        let mut out = s.to_string();
        for v in &self.0 {
            if out.contains(v.as_str()) {
                out = out.replace(v.as_str(), "***");
            }
        }
        out
    }

    /// A diagnostic with its message, path, help and file scrubbed.
    pub fn diagnostic(&self, mut d: Diagnostic) -> Diagnostic {
        d.message = self.text(&d.message);
        d.path = self.text(&d.path);
        d.help = self.text(&d.help);
        d.file = d.file.map(|f| self.text(&f));
        d
    }

    /// An error with every diagnostic scrubbed.
    pub fn error(&self, e: Error) -> Error {
        e.map_diagnostics(|d| self.diagnostic(d))
    }

    /// The reason and position of a rejected record scrubbed (the raw record is data,
    /// kept as read).
    pub fn record(&self, mut r: RejectedRecord) -> RejectedRecord {
        if self.0.is_empty() {
            return r;
        }
        r.reason = self.text(&r.reason);
        r.position.file = r.position.file.map(|f| self.text(&f));
        r.position.asset = self.text(&r.position.asset);
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn longer_values_are_replaced_whole_and_raw_records_are_kept() {
        let s = Scrubber(vec!["tenant-a-secret".into(), "tenant".into()]);
        assert_eq!(s.text("data/tenant-a-secret/x"), "data/***/x");
        let r = RejectedRecord {
            code: "ETL701".into(),
            reason: "cannot read data/tenant/x".into(),
            field: None,
            position: etlantic_core::data::SourcePosition {
                asset: "orders".into(),
                file: Some("data/tenant/x".into()),
                ..Default::default()
            },
            raw: "tenant".into(),
        };
        let r = s.record(r);
        assert_eq!(r.reason, "cannot read data/***/x");
        assert_eq!(r.position.file.as_deref(), Some("data/***/x"));
        assert_eq!(r.raw, "tenant");
    }
}

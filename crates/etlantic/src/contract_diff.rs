//! `etlantic diff` on two versions of a contract document: which changes break consumers
//! and which are compatible.
//!
//! Both documents must be contracts of the same standard, in YAML or JSON:
//!
//! | standard | recognised by | compared with |
//! |---|---|---|
//! | ODCS data contract | `apiVersion` and `kind: DataContract` | `odcs::diff` |
//! | DTCS transformation contract | `dtcsVersion` | `dtcs::compatibility::analyze` (all aspects) |
//! | DPCS pipeline contract | `dpcsVersion` | `dpcs::compare_contracts` |
//!
//! Each document is parsed and validated by its standard's crate first; the
//! classification of every change (breaking or compatible) is the crate's, not
//! ETLantic's. A pair of documents of different kinds is refused with `ETL009`; a
//! document that does not parse or validate with `ETL005` (ODCS) or `ETL010` (DTCS,
//! DPCS). [`ContractDiff::exit_code`] is [`crate::exit::BREAKING_CHANGES`] when any
//! change is breaking and [`crate::exit::OK`] otherwise.
//!
//! ```no_run
//! # fn demo() -> etlantic::core::Result<()> {
//! use std::path::Path;
//! if let Some(d) = etlantic::contract_diff::diff_files(Path::new("v1.odcs.yaml"), Path::new("v2.odcs.yaml"))? {
//!     print!("{}", d.render_text());
//!     std::process::exit(d.exit_code());
//! }
//! # Ok(()) }
//! ```

use crate::exit;
use etlantic_core::diagnostics::{codes, CodeInfo, Diagnostic, Diagnostics, Error, Result};
use serde::Serialize;
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// A contract standard `diff` can compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ContractStandard {
    /// An ODCS data contract.
    Odcs,
    /// A DTCS transformation contract.
    Dtcs,
    /// A DPCS pipeline contract.
    Dpcs,
}

impl ContractStandard {
    /// Lower-case name (`odcs`, `dtcs`, `dpcs`), as in JSON output.
    pub fn as_str(self) -> &'static str {
        match self {
            ContractStandard::Odcs => "odcs",
            ContractStandard::Dtcs => "dtcs",
            ContractStandard::Dpcs => "dpcs",
        }
    }

    /// What a document of this standard is called in messages.
    pub fn title(self) -> &'static str {
        match self {
            ContractStandard::Odcs => "ODCS data contract",
            ContractStandard::Dtcs => "DTCS transformation contract",
            ContractStandard::Dpcs => "DPCS pipeline contract",
        }
    }

    fn invalid_code(self) -> &'static CodeInfo {
        match self {
            ContractStandard::Odcs => &codes::CONTRACT_INVALID,
            ContractStandard::Dtcs | ContractStandard::Dpcs => &codes::CONTRACT_DOCUMENT_INVALID,
        }
    }
}

fn is_json(text: &str) -> bool {
    text.trim_start().starts_with('{')
}

fn standard_of(v: &Value) -> Option<ContractStandard> {
    let m = v.as_object()?;
    if m.contains_key("dtcsVersion") {
        Some(ContractStandard::Dtcs)
    } else if m.contains_key("dpcsVersion") {
        Some(ContractStandard::Dpcs)
    } else if m.contains_key("apiVersion") && m.get("kind") == Some(&Value::from("DataContract")) {
        Some(ContractStandard::Odcs)
    } else {
        None
    }
}

/// The standard of a contract document (YAML or JSON), or `None` when the text is not a
/// contract (a pipeline, a plan, anything else).
///
/// A well-formed document is recognised by its top-level keys (`dtcsVersion`,
/// `dpcsVersion`, or `apiVersion` with `kind: DataContract`). Text that is not well
/// formed is recognised by those markers anywhere in it, so that a broken contract is
/// reported as a broken contract rather than as a broken pipeline.
pub fn detect(text: &str) -> Option<ContractStandard> {
    let parsed: Option<Value> = if is_json(text) {
        serde_json::from_str(text).ok()
    } else {
        serde_yaml::from_str(text).ok()
    };
    match parsed {
        Some(v) => standard_of(&v),
        None if text.contains("dtcsVersion") => Some(ContractStandard::Dtcs),
        None if text.contains("dpcsVersion") => Some(ContractStandard::Dpcs),
        None if text.contains("apiVersion") && text.contains("DataContract") => {
            Some(ContractStandard::Odcs)
        }
        None => None,
    }
}

/// One difference between the two versions, as the standard's crate classifies it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContractChange {
    /// Whether it breaks consumers of the old version.
    pub breaking: bool,
    /// The crate's classification: ODCS `breaking`, `additive`, `deprecated`,
    /// `unchanged`; DTCS `breaking` or `compatible` (additive or conditional); DPCS
    /// `breaking`, `conditional` or `additive`.
    pub kind: String,
    /// Where in the document (the crate's object reference).
    pub path: String,
    /// What changed.
    pub message: String,
    /// The crate's diagnostic code for it.
    pub code: String,
}

/// One side of a comparison.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContractVersion {
    /// The file (as given on the command line).
    pub file: String,
    /// The contract's `id`.
    pub id: String,
    /// The contract's `version`.
    pub version: String,
}

/// The result of comparing two versions of a contract.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ContractDiff {
    /// The standard of both documents.
    pub standard: ContractStandard,
    /// The old version.
    pub old: ContractVersion,
    /// The new version.
    pub new: ContractVersion,
    /// The crate's overall verdict: ODCS `compatible`/`incompatible`; DTCS
    /// `identical`, `backwardCompatible`, `forwardCompatible`, `conditionallyCompatible`,
    /// `incompatible`; DPCS `fullyCompatible`, `backwardCompatible`,
    /// `forwardCompatible`, `conditionallyCompatible`, `incompatible`.
    pub compatibility: String,
    /// Whether any change is breaking (or the crate's verdict is `incompatible`).
    pub breaking: bool,
    /// The changes, breaking ones first, then by path.
    pub changes: Vec<ContractChange>,
}

impl ContractDiff {
    /// The breaking changes.
    pub fn breaking_changes(&self) -> impl Iterator<Item = &ContractChange> {
        self.changes.iter().filter(|c| c.breaking)
    }

    /// The exit code of `etlantic diff`: [`exit::BREAKING_CHANGES`] when a change is
    /// breaking, [`exit::OK`] when all are compatible.
    pub fn exit_code(&self) -> i32 {
        if self.breaking {
            exit::BREAKING_CHANGES
        } else {
            exit::OK
        }
    }

    /// The comparison as text, one line per change.
    pub fn render_text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} `{}` {} ({}) → `{}` {} ({})",
            self.standard.title(),
            self.old.id,
            self.old.version,
            self.old.file,
            self.new.id,
            self.new.version,
            self.new.file
        );
        if self.changes.is_empty() {
            out.push_str("  no changes\n");
        }
        for c in &self.changes {
            let label = if c.breaking { "BREAKING" } else { "compatible" };
            let path = if c.path.is_empty() {
                String::new()
            } else {
                format!("{}: ", c.path)
            };
            let _ = writeln!(out, "  {label:<10}  {path}{} [{}]", c.message, c.kind);
        }
        let breaking = self.breaking_changes().count();
        let compatible = self.changes.len() - breaking;
        let _ = writeln!(
            out,
            "{}: {} breaking, {} compatible change(s); {}",
            self.compatibility,
            breaking,
            compatible,
            if self.breaking {
                "consumers of the old version may break"
            } else {
                "the new version is compatible"
            }
        );
        out
    }
}

fn error(code: &CodeInfo, message: String, help: Option<&str>) -> Error {
    let mut d = Diagnostic::new(code, message);
    if let Some(h) = help {
        d = d.help(h);
    }
    Error::from(d)
}

/// The exit code of `etlantic diff` for an error of [`diff_files`] or [`diff_texts`]:
/// [`exit::USAGE`] for documents of different kinds (`ETL009`), otherwise the phase's
/// code ([`exit::INVALID_PIPELINE`] for an unreadable or invalid document).
pub fn exit_code_for_error(e: &Error) -> i32 {
    if e.0.contains_code(&codes::CONTRACT_KIND_MISMATCH) {
        exit::USAGE
    } else {
        exit::for_error(e)
    }
}

/// An invalid-document error with one diagnostic per message of the standard's crate.
fn invalid(
    standard: ContractStandard,
    origin: &str,
    problems: Vec<(String, Option<String>, Option<String>)>,
) -> Error {
    let code = standard.invalid_code();
    let mut diags = Diagnostics::new();
    for (message, at, help) in problems {
        let mut d = Diagnostic::new(
            code,
            format!(
                "{origin}: {} does not validate: {message}",
                standard.title()
            ),
        )
        .in_file(origin);
        if let Some(at) = at.filter(|a| !a.is_empty()) {
            d = d.at(at);
        }
        if let Some(h) = help {
            d = d.help(h);
        }
        diags.push(d);
    }
    if diags.is_empty() {
        diags.push(
            Diagnostic::new(code, format!("{origin}: not a valid {}", standard.title()))
                .in_file(origin),
        );
    }
    Error(diags)
}

fn parse_odcs(text: &str, origin: &str) -> Result<odcs::DataContract> {
    let format = if is_json(text) {
        odcs::DocumentFormat::Json
    } else {
        odcs::DocumentFormat::Yaml
    };
    odcs::parse_strict(text.as_bytes(), format).map_err(|r| {
        invalid(
            ContractStandard::Odcs,
            origin,
            r.errors()
                .iter()
                .map(|d| {
                    (
                        format!("{} [{}]", d.message, d.id),
                        d.object_ref.clone(),
                        d.remediation.clone(),
                    )
                })
                .collect(),
        )
    })
}

fn parse_dtcs(text: &str, origin: &str) -> Result<dtcs::TransformationContract> {
    let format = if is_json(text) {
        dtcs::DocumentFormat::Json
    } else {
        dtcs::DocumentFormat::Yaml
    };
    let problems = |r: &dtcs::DiagnosticReport| -> Vec<(String, Option<String>, Option<String>)> {
        r.errors()
            .iter()
            .map(|d| {
                (
                    format!("{} [{}]", d.message, d.id),
                    d.object_ref.clone(),
                    d.remediation.clone(),
                )
            })
            .collect()
    };
    let c = dtcs::parse(text.as_bytes(), format)
        .into_contract()
        .map_err(|r| invalid(ContractStandard::Dtcs, origin, problems(&r)))?;
    let report = dtcs::validate(&c);
    if !report.is_valid() {
        return Err(invalid(ContractStandard::Dtcs, origin, problems(&report)));
    }
    Ok(c)
}

fn parse_dpcs(text: &str, origin: &str) -> Result<dpcs::PipelineContract> {
    let parsed = if is_json(text) {
        dpcs::parse_json(text)
    } else {
        dpcs::parse_yaml(text)
    };
    let c = parsed.map_err(|e| {
        invalid(
            ContractStandard::Dpcs,
            origin,
            vec![(e.to_string(), None, None)],
        )
    })?;
    let report = dpcs::validate(&c);
    if !report.is_valid() {
        return Err(invalid(
            ContractStandard::Dpcs,
            origin,
            report
                .errors()
                .map(|d| {
                    (
                        format!("{} [{}]", d.message, d.id),
                        d.object_ref.clone(),
                        d.remediation.clone(),
                    )
                })
                .collect(),
        ));
    }
    Ok(c)
}

fn version(file: &str, id: &str, version: &str) -> ContractVersion {
    ContractVersion {
        file: file.to_string(),
        id: id.to_string(),
        version: version.to_string(),
    }
}

fn diff_odcs(old: &str, old_file: &str, new: &str, new_file: &str) -> Result<ContractDiff> {
    let a = parse_odcs(old, old_file)?;
    let b = parse_odcs(new, new_file)?;
    let report = odcs::diff(&a, &b);
    let changes = report
        .changes
        .iter()
        .map(|c| ContractChange {
            breaking: c.kind == odcs::ChangeKind::Breaking,
            kind: match c.kind {
                odcs::ChangeKind::Breaking => "breaking",
                odcs::ChangeKind::Additive => "additive",
                odcs::ChangeKind::Deprecated => "deprecated",
                odcs::ChangeKind::Unchanged => "unchanged",
            }
            .to_string(),
            path: c.path.clone(),
            message: c.message.clone(),
            code: c.code.clone(),
        })
        .collect();
    Ok(finish(
        ContractStandard::Odcs,
        version(old_file, &a.id, &a.version),
        version(new_file, &b.id, &b.version),
        if report.has_breaking {
            "incompatible"
        } else {
            "compatible"
        }
        .to_string(),
        changes,
    ))
}

fn diff_dtcs(old: &str, old_file: &str, new: &str, new_file: &str) -> Result<ContractDiff> {
    let a = parse_dtcs(old, old_file)?;
    let b = parse_dtcs(new, new_file)?;
    let report = dtcs::compatibility::analyze(&a, &b, dtcs::ComparisonScope::all());
    let level = report.level;
    let mut diagnostics = report.diagnostics;
    // `analyze` closes an incompatible verdict with a summary diagnostic that names no
    // object; it is the verdict, not a change.
    if level == dtcs::CompatibilityLevel::Incompatible
        && diagnostics.last().is_some_and(|d| {
            d.object_ref.is_none() && d.id == dtcs::diagnostics::codes::INCOMPATIBLE_CONTRACT
        })
    {
        diagnostics.pop();
    }
    let changes = diagnostics
        .iter()
        .map(|d| {
            let breaking = d.severity.is_error();
            ContractChange {
                breaking,
                kind: if breaking { "breaking" } else { "compatible" }.to_string(),
                path: d.object_ref.clone().unwrap_or_default(),
                message: d.message.clone(),
                code: d.id.clone(),
            }
        })
        .collect();
    let compatibility = serde_json::to_value(level)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{level:?}"));
    Ok(finish(
        ContractStandard::Dtcs,
        version(old_file, &a.id, &a.version),
        version(new_file, &b.id, &b.version),
        compatibility,
        changes,
    ))
}

fn diff_dpcs(old: &str, old_file: &str, new: &str, new_file: &str) -> Result<ContractDiff> {
    let a = parse_dpcs(old, old_file)?;
    let b = parse_dpcs(new, new_file)?;
    let result = dpcs::compare_contracts(&a, &b);
    let report = result.report();
    let changes = report
        .diagnostics
        .iter()
        .map(|d| {
            let (breaking, kind) = match d.severity {
                dpcs::Severity::Error => (true, "breaking"),
                dpcs::Severity::Warning => (false, "conditional"),
                dpcs::Severity::Information => (false, "additive"),
            };
            ContractChange {
                breaking,
                kind: kind.to_string(),
                path: d.object_ref.clone().unwrap_or_default(),
                message: d.message.clone(),
                code: d.id.clone(),
            }
        })
        .collect();
    Ok(finish(
        ContractStandard::Dpcs,
        version(old_file, &a.id, &a.version),
        version(new_file, &b.id, &b.version),
        report.category.to_string(),
        changes,
    ))
}

fn finish(
    standard: ContractStandard,
    old: ContractVersion,
    new: ContractVersion,
    compatibility: String,
    mut changes: Vec<ContractChange>,
) -> ContractDiff {
    changes.sort_by(|a, b| {
        (!a.breaking, &a.path, &a.message).cmp(&(!b.breaking, &b.path, &b.message))
    });
    changes.dedup();
    let breaking = changes.iter().any(|c| c.breaking) || compatibility == "incompatible";
    ContractDiff {
        standard,
        old,
        new,
        compatibility,
        breaking,
        changes,
    }
}

fn describe(kind: Option<ContractStandard>) -> &'static str {
    match kind {
        Some(s) => s.title(),
        None => "not a contract document (a pipeline or a plan?)",
    }
}

/// Compares two contract documents given as text; `old_file` and `new_file` name them in
/// the result and in diagnostics.
///
/// Errors: `ETL009` when the two are not contracts of the same standard, `ETL005`
/// (ODCS) or `ETL010` (DTCS, DPCS) when one does not parse or validate.
pub fn diff_texts(old: &str, old_file: &str, new: &str, new_file: &str) -> Result<ContractDiff> {
    let (a, b) = (detect(old), detect(new));
    match (a, b) {
        (Some(x), Some(y)) if x == y => match x {
            ContractStandard::Odcs => diff_odcs(old, old_file, new, new_file),
            ContractStandard::Dtcs => diff_dtcs(old, old_file, new, new_file),
            ContractStandard::Dpcs => diff_dpcs(old, old_file, new, new_file),
        },
        _ => Err(error(
            &codes::CONTRACT_KIND_MISMATCH,
            format!(
                "cannot compare `{old_file}` ({}) with `{new_file}` ({})",
                describe(a),
                describe(b)
            ),
            Some(
                "Give `etlantic diff` two versions of the same kind of document: two ODCS, two DTCS or two DPCS contracts (YAML or JSON), or two plans/pipelines.",
            ),
        )),
    }
}

/// Compares two files when at least one of them is a contract document; `Ok(None)` when
/// neither is (they are plans or pipelines, for [`crate::plan::diff`]).
///
/// Errors as [`diff_texts`], and `ETL001` when one file is a contract and the other
/// cannot be read.
pub fn diff_files(old: &Path, new: &Path) -> Result<Option<ContractDiff>> {
    let read = |p: &Path| std::fs::read_to_string(p);
    let (a, b) = (read(old), read(new));
    let is_contract = |t: &std::io::Result<String>| t.as_ref().ok().and_then(|t| detect(t));
    if is_contract(&a).is_none() && is_contract(&b).is_none() {
        return Ok(None);
    }
    let text = |r: std::io::Result<String>, p: &Path| {
        r.map_err(|e| {
            Error::from(
                Diagnostic::new(
                    &codes::FILE_UNREADABLE,
                    format!("cannot read `{}`: {e}", p.display()),
                )
                .in_file(p.display().to_string()),
            )
        })
    };
    let (a, b) = (text(a, old)?, text(b, new)?);
    diff_texts(
        &a,
        &old.display().to_string(),
        &b,
        &new.display().to_string(),
    )
    .map(Some)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_are_recognised_by_their_top_level_keys() {
        assert_eq!(
            detect("apiVersion: v3.1.0\nkind: DataContract\nid: x\n"),
            Some(ContractStandard::Odcs)
        );
        assert_eq!(
            detect("{\"dtcsVersion\": \"1.0.0\"}"),
            Some(ContractStandard::Dtcs)
        );
        assert_eq!(
            detect("dpcsVersion: 1.0.0\nid: p\n"),
            Some(ContractStandard::Dpcs)
        );
        assert_eq!(detect("apiVersion: etlantic/v1\nkind: Pipeline\n"), None);
        assert_eq!(detect("{\"format\": \"etlantic.pipeline-plan/1\"}"), None);
        // Broken text is still recognised by its markers.
        assert_eq!(
            detect("dtcsVersion: [1.0.0\n  id: {"),
            Some(ContractStandard::Dtcs)
        );
    }

    #[test]
    fn mismatched_standards_are_a_usage_error_not_a_panic() {
        let e = diff_texts("dtcsVersion: 1.0.0\n", "a", "dpcsVersion: 1.0.0\n", "b")
            .expect_err("mismatch");
        assert_eq!(e.code(), "ETL009");
        assert!(e.0.iter().all(|d| !d.help.is_empty()));
        assert_eq!(exit_code_for_error(&e), exit::USAGE);
        let e = diff_texts(
            "dpcsVersion: 1.0.0\n",
            "a",
            "apiVersion: etlantic/v1\nkind: Pipeline\n",
            "b",
        )
        .expect_err("mismatch");
        assert_eq!(e.code(), "ETL009");
    }

    #[test]
    fn unparseable_documents_are_diagnostics_with_codes() {
        let e = diff_texts(
            "dtcsVersion: [1.0.0\n",
            "a.yaml",
            "dtcsVersion: [1.0.0\n",
            "b.yaml",
        )
        .expect_err("invalid");
        assert_eq!(e.code(), "ETL010");
        assert_eq!(exit_code_for_error(&e), exit::INVALID_PIPELINE);
        let e = diff_texts(
            "dpcsVersion: 1.0.0\nid: p\n",
            "a.yaml",
            "dpcsVersion: 1.0.0\nid: p\n",
            "b.yaml",
        )
        .expect_err("invalid");
        assert_eq!(e.code(), "ETL010");
        let e = diff_texts(
            "apiVersion: v3.1.0\nkind: DataContract\n",
            "a.yaml",
            "apiVersion: v3.1.0\nkind: DataContract\n",
            "b.yaml",
        )
        .expect_err("invalid");
        assert_eq!(e.code(), "ETL005");
    }
}

//! Renderers: human text, JSON and SARIF 2.1.0.

use super::{codes, Diagnostic, Diagnostics, Severity};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::str::FromStr;

/// The output formats of commands that report diagnostics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OutputFormat {
    /// Text for a terminal.
    #[default]
    Human,
    /// One JSON document.
    Json,
    /// SARIF 2.1.0, for code-scanning tools.
    Sarif,
}

impl FromStr for OutputFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "human" => Ok(Self::Human),
            "json" => Ok(Self::Json),
            "sarif" => Ok(Self::Sarif),
            other => Err(format!(
                "unknown format `{other}` (expected human, json or sarif)"
            )),
        }
    }
}

/// Renders diagnostics in the given format.
pub fn render(diags: &Diagnostics, format: OutputFormat) -> String {
    match format {
        OutputFormat::Human => render_human(diags),
        OutputFormat::Json => {
            serde_json::to_string_pretty(&render_json(diags)).expect("diagnostics serialise")
        }
        OutputFormat::Sarif => {
            serde_json::to_string_pretty(&render_sarif(diags)).expect("diagnostics serialise")
        }
    }
}

/// Renders diagnostics as text, one block per diagnostic, then a summary line.
pub fn render_human(diags: &Diagnostics) -> String {
    let mut out = String::new();
    for d in diags.iter() {
        out.push_str(&format!(
            "{}[{}]: {}\n",
            d.severity.as_str(),
            d.code,
            d.message
        ));
        match (&d.file, d.line) {
            (Some(f), Some(l)) => out.push_str(&format!("  --> {f}:{l}\n")),
            (Some(f), None) => out.push_str(&format!("  --> {f}\n")),
            _ => {}
        }
        if !d.path.is_empty() {
            out.push_str(&format!("   = at: {}\n", d.path));
        }
        out.push_str(&format!("   = phase: {}\n", d.phase.as_str()));
        if !d.help.is_empty() {
            out.push_str(&format!("   = help: {}\n", d.help));
        }
    }
    out.push_str(&format!(
        "{} error(s), {} warning(s)\n",
        diags.error_count(),
        diags.warning_count()
    ));
    out
}

/// Renders diagnostics as a JSON value `{"diagnostics": [...], "errors": n, "warnings": n}`.
pub fn render_json(diags: &Diagnostics) -> Value {
    json!({
        "diagnostics": diags,
        "errors": diags.error_count(),
        "warnings": diags.warning_count(),
    })
}

fn sarif_level(s: Severity) -> &'static str {
    match s {
        Severity::Error => "error",
        Severity::Warning => "warning",
        Severity::Info => "note",
    }
}

/// Renders diagnostics as a SARIF 2.1.0 log with one run.
///
/// Every code used becomes a rule of the tool driver; each diagnostic is a result whose
/// physical location is its file (and line) and whose logical location is its path.
pub fn render_sarif(diags: &Diagnostics) -> Value {
    // Rules in code order, each once; results refer to them by index.
    let used: BTreeMap<&str, usize> = {
        let mut codes: Vec<&str> = diags.iter().map(|d| d.code.as_str()).collect();
        codes.sort();
        codes.dedup();
        codes.into_iter().enumerate().map(|(i, c)| (c, i)).collect()
    };
    let rules: Vec<Value> = used
        .keys()
        .map(|code| {
            let info = codes::lookup(code);
            json!({
                "id": code,
                "name": info.map(|i| i.name).unwrap_or(code),
                "shortDescription": {"text": info.map(|i| i.title).unwrap_or(code)},
                "help": {"text": info.map(|i| i.help).unwrap_or("")},
                "defaultConfiguration": {"level": sarif_level(info.map(|i| i.severity).unwrap_or(Severity::Error))},
                "properties": {"phase": info.map(|i| i.phase.as_str()).unwrap_or("")},
            })
        })
        .collect();
    let results: Vec<Value> = diags.iter().map(|d| sarif_result(d, &used)).collect();
    json!({
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "etlantic",
                "version": env!("CARGO_PKG_VERSION"),
                "informationUri": "https://github.com/etlantic/etlantic-rs",
                "rules": rules,
            }},
            "results": results,
        }]
    })
}

fn sarif_result(d: &Diagnostic, rules: &BTreeMap<&str, usize>) -> Value {
    let mut text = d.message.clone();
    if !d.help.is_empty() {
        text.push_str(&format!(" Help: {}", d.help));
    }
    let mut location = serde_json::Map::new();
    if let Some(file) = &d.file {
        let mut physical = json!({"artifactLocation": {"uri": file}});
        if let Some(line) = d.line {
            physical["region"] = json!({"startLine": line});
        }
        location.insert("physicalLocation".into(), physical);
    }
    if !d.path.is_empty() {
        location.insert(
            "logicalLocations".into(),
            json!([{"fullyQualifiedName": d.path}]),
        );
    }
    let mut result = json!({
        "ruleId": d.code,
        "ruleIndex": rules.get(d.code.as_str()).copied().unwrap_or(0),
        "level": sarif_level(d.severity),
        "message": {"text": text},
        "properties": {"phase": d.phase.as_str()},
    });
    if !location.is_empty() {
        result["locations"] = json!([Value::Object(location)]);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::codes::*;

    fn sample() -> Diagnostics {
        let mut d = Diagnostics::new();
        d.push(
            Diagnostic::new(&UNKNOWN_NODE, "input `x` refers to unknown node `nope`")
                .at("transforms[clean].inputs.x")
                .in_file("pipeline.yaml")
                .on_line(12),
        );
        d.push(Diagnostic::new(&UNUSED_NODE, "source `s2` feeds nothing").at("sources[s2]"));
        d
    }

    #[test]
    fn human_mentions_code_path_and_help() {
        let text = render_human(&sample());
        assert!(text.contains("error[ETL201]: input `x` refers to unknown node `nope`"));
        assert!(text.contains("--> pipeline.yaml:12"));
        assert!(text.contains("= at: transforms[clean].inputs.x"));
        assert!(text.contains("= help: Refer to the id"));
        assert!(text.ends_with("1 error(s), 1 warning(s)\n"));
    }

    #[test]
    fn json_round_trips() {
        let v = render_json(&sample());
        assert_eq!(v["errors"], 1);
        let back: Diagnostics = serde_json::from_value(v["diagnostics"].clone()).unwrap();
        assert_eq!(back, sample());
    }

    #[test]
    fn sarif_has_rules_and_locations() {
        let v = render_sarif(&sample());
        assert_eq!(v["version"], "2.1.0");
        let run = &v["runs"][0];
        let rules = run["tool"]["driver"]["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[0]["id"], "ETL106");
        let r0 = &run["results"][0];
        assert_eq!(r0["ruleId"], "ETL201");
        assert_eq!(r0["ruleIndex"], 1);
        assert_eq!(r0["level"], "error");
        assert_eq!(
            r0["locations"][0]["physicalLocation"]["region"]["startLine"],
            12
        );
        assert_eq!(run["results"][1]["level"], "warning");
    }
}

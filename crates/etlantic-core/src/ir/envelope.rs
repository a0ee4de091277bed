//! The envelope of a portable plan: the keys around its actions that say which DTCS
//! profile and specification it follows, which transformation it implements and how
//! expression errors behave.
//!
//! ETLantic-py's compilers take plans without an envelope (its conformance corpus hands
//! them only `planIdentity`, `inputs`, `actions`, `outputs` and `requirements`), while
//! the `dtcs` crate requires one. [`complete`] fills what is missing with ETLantic-py's
//! defaults; [`check`] refuses values this release cannot honour, so that a plan is never
//! run under a profile, a specification or an error mode it does not declare.

use crate::diagnostics::{codes, Diagnostic, Result};
use serde_json::{Map, Value};

/// The profile of a plan that names none: ETLantic-py's default, the relational kernel.
pub const DEFAULT_PROFILE: &str = dtcs::KERNEL_PROFILE;

/// The transformation id of a plan that names none.
pub const DEFAULT_TRANSFORMATION: &str = "anonymous";

/// The error mode of a plan that names none, and the only one this release runs: an
/// expression error stops the step.
pub const DEFAULT_ERROR_MODE: &str = "fail";

/// The DTCS profiles a plan may declare: those of the `dtcs` crate and the first
/// versions ETLantic-py still writes.
pub const KNOWN_PROFILES: &[&str] = &[
    dtcs::KERNEL_PROFILE,
    dtcs::RELATIONAL_PROFILE,
    dtcs::WINDOW_PROFILE,
    dtcs::COMPLEX_TYPES_PROFILE,
    dtcs::COMPLEX_VALUES_PROFILE,
    dtcs::STRING_ADVANCED_PROFILE,
    dtcs::CONVERSION_PROFILE,
    dtcs::STATISTICS_PROFILE,
    dtcs::RESHAPE_PROFILE,
    dtcs::RELATIONAL_EXTENDED_PROFILE,
    dtcs::TEMPORAL_IANA_PROFILE,
    dtcs::NONDETERMINISTIC_PROFILE,
    "dtcs:profile/portable-relational-kernel/1",
    "dtcs:profile/portable-relational/1",
    "dtcs:profile/portable-window/1",
];

/// The DTCS specification major version plans must follow.
pub const SPEC_MAJOR: &str = "3";

fn invalid(origin: &str, key: &str, message: String, help: &str) -> crate::diagnostics::Error {
    Diagnostic::new(
        &codes::TRANSFORM_PLAN_INVALID,
        format!("{origin}: {message}"),
    )
    .in_file(origin)
    .at(key)
    .help(help)
    .into()
}

/// Fills the envelope keys a `dtcs.transform-plan/2` document leaves out (or sets to
/// null) with the defaults above and [`dtcs::SPEC_VERSION`]. A key given with another
/// type than a string is an error (`ETL006`). Other plan identities are left to the
/// `dtcs` crate, which migrates `dtcs.transform-plan/1` and refuses the rest.
pub fn complete(doc: &mut Map<String, Value>, origin: &str) -> Result<()> {
    match doc.get("planIdentity") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == dtcs::TRANSFORM_PLAN_IDENTITY => {}
        Some(_) => return Ok(()),
    }
    for (key, default) in [
        ("profile", DEFAULT_PROFILE),
        ("specificationVersion", dtcs::SPEC_VERSION),
        ("transformation", DEFAULT_TRANSFORMATION),
        ("errorMode", DEFAULT_ERROR_MODE),
    ] {
        match doc.get(key) {
            None | Some(Value::Null) => {
                doc.insert(key.into(), Value::String(default.into()));
            }
            Some(Value::String(_)) => {}
            Some(other) => {
                return Err(invalid(
                    origin,
                    key,
                    format!("`{key}` must be a string, got {other}"),
                    &format!("Leave `{key}` out for its default `{default}`."),
                ))
            }
        }
    }
    Ok(())
}

/// Refuses an envelope this release cannot honour: an unknown profile, a specification
/// other than DTCS 3, an error mode other than `fail`, an empty transformation id.
pub fn check(plan: &dtcs::PortablePlan, origin: &str) -> Result<()> {
    if !KNOWN_PROFILES.contains(&plan.profile.as_str()) {
        return Err(invalid(
            origin,
            "profile",
            format!("unknown DTCS profile `{}`", plan.profile),
            &format!(
                "Declare one of {}, or leave `profile` out (default {DEFAULT_PROFILE}).",
                KNOWN_PROFILES.join(", ")
            ),
        ));
    }
    let version = &plan.specification_version;
    let parts: Vec<&str> = version.split('.').collect();
    let well_formed = parts.len() == 3 && parts.iter().all(|p| p.parse::<u32>().is_ok());
    if !well_formed || parts[0] != SPEC_MAJOR {
        return Err(invalid(
            origin,
            "specificationVersion",
            format!("DTCS specification version `{version}` is not supported"),
            &format!(
                "This release reads plans of DTCS {SPEC_MAJOR} (`{SPEC_MAJOR}.x.y`; it writes {}).",
                dtcs::SPEC_VERSION
            ),
        ));
    }
    match plan.error_mode.as_deref() {
        Some(DEFAULT_ERROR_MODE) | None => {}
        Some(mode @ ("invalid" | "null" | "route")) => {
            return Err(invalid(
                origin,
                "errorMode",
                format!("errorMode `{mode}` is not supported: an expression error would have to become {}", match mode {
                    "null" => "a null",
                    "invalid" => "an invalid value",
                    _ => "a routed row",
                }),
                "Use errorMode `fail` (an expression error stops the step); send bad records to the quarantine with contract rules instead.",
            ))
        }
        Some(other) => {
            return Err(invalid(
                origin,
                "errorMode",
                format!("unknown errorMode `{other}`"),
                "DTCS error modes are fail, invalid, null and route; this release runs `fail`.",
            ))
        }
    }
    if plan.transformation.trim().is_empty() {
        return Err(invalid(
            origin,
            "transformation",
            "`transformation` is empty".into(),
            &format!("Name the transformation the plan implements, or leave the key out (default `{DEFAULT_TRANSFORMATION}`)."),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::ir::TransformPlan;
    use serde_json::{json, Value};

    /// A plan as ETLantic-py's conformance corpus writes it: no envelope.
    fn bare() -> Value {
        json!({
            "planIdentity": "dtcs.transform-plan/2",
            "inputs": {"t": {"id": "t"}},
            "actions": [{"id": "l1", "kind": {"action": "dtcs:limit", "id": "l1",
                          "parameters": {"n": 2}, "target": "t"}}],
            "outputs": {"result": {"id": "result"}},
            "requirements": {"dependencies": [{"from": "l1", "to": "result", "reason": "lineage"}]}
        })
    }

    fn refusal(mut plan: Value, key: &str, value: Value) -> String {
        plan[key] = value;
        let e = TransformPlan::from_value(&plan, "p.json").unwrap_err();
        assert_eq!(e.code(), "ETL006", "{e}");
        let d = e.diagnostics().iter().next().unwrap();
        assert_eq!(d.path, key, "{e}");
        d.message.clone()
    }

    #[test]
    fn a_plan_without_envelope_gets_etlantic_py_defaults() {
        let t = TransformPlan::from_value(&bare(), "p.json").unwrap();
        assert_eq!(t.profile(), dtcs::KERNEL_PROFILE);
        assert_eq!(t.transformation(), "anonymous");
        assert_eq!(t.portable().specification_version, dtcs::SPEC_VERSION);
        assert_eq!(t.portable().error_mode.as_deref(), Some("fail"));
        // Nulls are absent values; the fingerprint is that of the completed plan.
        let mut nulls = bare();
        nulls["profile"] = Value::Null;
        let n = TransformPlan::from_value(&nulls, "p.json").unwrap();
        assert_eq!(n.fingerprint(), t.fingerprint());
    }

    #[test]
    fn envelope_values_that_cannot_be_honoured_are_refused() {
        assert!(refusal(bare(), "profile", json!("bogus")).contains("unknown DTCS profile `bogus`"));
        assert!(refusal(bare(), "profile", json!(7)).contains("must be a string"));
        assert!(refusal(bare(), "specificationVersion", json!("2.0.0")).contains("`2.0.0`"));
        assert!(refusal(bare(), "specificationVersion", json!("3.x")).contains("`3.x`"));
        assert!(refusal(bare(), "errorMode", json!("null")).contains("a null"));
        // An error mode DTCS does not know: the `dtcs` crate refuses it.
        let mut unknown = bare();
        unknown["errorMode"] = json!("sometimes");
        let e = TransformPlan::from_value(&unknown, "p.json").unwrap_err();
        assert!(e.to_string().contains("errorMode"), "{e}");
        assert!(refusal(bare(), "transformation", json!(" ")).contains("empty"));
        // What is given and known loads.
        let mut given = bare();
        given["profile"] = json!("dtcs:profile/portable-window/1");
        given["specificationVersion"] = json!("3.1.0");
        given["transformation"] = json!("top_two");
        let t = TransformPlan::from_value(&given, "p.json").unwrap();
        assert_eq!(t.transformation(), "top_two");
    }
}

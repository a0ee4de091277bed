//! Every bad input of issue 2 fails with its exact diagnostic code, the path of the
//! offending node, a hint and the documented exit code — and nothing runs.

mod common;

use common::*;
use serde_json::Value;

/// What a failing case must report.
struct Expect<'a> {
    code: &'a str,
    exit: i32,
    /// The exact `path` of the diagnostic (`None`: the diagnostic has a line instead).
    path: Option<&'a str>,
    /// The file the diagnostic points at.
    file: Option<&'a str>,
    /// The 1-based line, when the diagnostic must carry one.
    line: Option<u64>,
}

impl<'a> Expect<'a> {
    fn at(code: &'a str, exit: i32, path: &'a str) -> Self {
        Expect {
            code,
            exit,
            path: Some(path),
            file: Some("pipeline.yaml"),
            line: None,
        }
    }

    fn file(mut self, file: &'a str) -> Self {
        self.file = Some(file);
        self
    }

    fn line(mut self, line: u64) -> Self {
        self.line = Some(line);
        self
    }

    fn no_path(mut self) -> Self {
        self.path = None;
        self
    }
}

/// Runs `validate` (json, sarif, human), `plan` and `run` with `args` and checks each
/// reports `e` with its exit code, and that the run wrote nothing.
#[track_caller]
fn assert_fails(p: &Project, args: &[&str], e: Expect) -> Value {
    let with = |cmd: &str, extra: &[&str]| -> Vec<String> {
        let mut v = vec![cmd.to_string()];
        v.extend(args.iter().map(|s| s.to_string()));
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let call = |v: Vec<String>| {
        let refs: Vec<&str> = v.iter().map(String::as_str).collect();
        p.run(&refs)
    };

    // validate --format json: the diagnostics on stdout.
    let r = call(with("validate", &["--format", "json"]));
    r.expect_code(e.exit);
    let json = r.stdout_json();
    let codes = error_codes(&json);
    assert_eq!(
        codes.first().map(String::as_str),
        Some(e.code),
        "first error should be {}: {json:#}",
        e.code
    );
    assert_eq!(json["errors"].as_u64().unwrap() as usize, codes.len());
    let d = find_diag(&json, e.code);
    assert_eq!(d["severity"], "error");
    if let Some(path) = e.path {
        assert_eq!(d["path"], path, "path of {}: {d:#}", e.code);
    }
    if let Some(file) = e.file {
        assert_eq!(d["file"], file, "file of {}: {d:#}", e.code);
    }
    if let Some(line) = e.line {
        assert_eq!(d["line"], line, "line of {}: {d:#}", e.code);
    }
    assert!(
        !d["help"].as_str().unwrap_or("").is_empty(),
        "{} has a hint: {d:#}",
        e.code
    );
    assert!(!d["message"].as_str().unwrap_or("").is_empty());
    assert!(d["phase"].is_string());

    // validate --format sarif.
    let r = call(with("validate", &["--format", "sarif"]));
    r.expect_code(e.exit);
    let sarif = r.stdout_json();
    assert_sarif_has(&sarif, e.code);
    let result = sarif["runs"][0]["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["ruleId"] == e.code)
        .unwrap()
        .clone();
    assert_eq!(result["level"], "error");

    // validate (human): code, path and hint in the text.
    let r = call(with("validate", &[]));
    r.expect_code(e.exit);
    assert!(
        r.stdout.contains(&format!("error[{}]", e.code)),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("= help: "), "{}", r.stdout);
    if let Some(path) = e.path {
        assert!(r.stdout.contains(&format!("= at: {path}")), "{}", r.stdout);
    }

    // plan and run fail the same way; diagnostics go to stderr.
    let r = call(with("plan", &["--format", "json"]));
    r.expect_code(e.exit);
    assert!(
        r.stdout.trim().is_empty(),
        "plan printed a plan: {}",
        r.stdout
    );
    assert_eq!(
        error_codes(&r.stderr_json()).first().map(String::as_str),
        Some(e.code)
    );
    let r = call(with("run", &[]));
    r.expect_code(e.exit);
    assert!(
        r.stderr.contains(&format!("error[{}]", e.code)),
        "{}",
        r.stderr
    );
    let r = call(with("run", &["--format", "sarif"]));
    r.expect_code(e.exit);
    assert_sarif_has(&r.stderr_json(), e.code);

    // Nothing ran.
    assert!(
        !p.exists("out"),
        "a failed validation must not run anything, but out/ exists"
    );
    json
}

// ---------------------------------------------------------------- miswired pipelines

const ORDERS_AMOUNT_AS_STRING: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders_v2"
name: "orders_v2"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - {name: "order_id", logicalType: "integer", required: true}
      - {name: "customer", logicalType: "string", required: true}
      - {name: "amount", logicalType: "string", required: true}
      - {name: "status", logicalType: "string", required: true}
      - {name: "ordered_at", logicalType: "timestamp"}
"#;

#[test]
fn port_types_that_do_not_match_etl301() {
    let p = Project::init();
    p.write("contracts/orders_v2.odcs.yaml", ORDERS_AMOUNT_AS_STRING);
    p.edit(
        "pipeline.yaml",
        "      orders: orders\n",
        "      orders:\n        from: orders\n        contract: contracts/orders_v2.odcs.yaml\n",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at(
            "ETL301",
            exit::INVALID_PIPELINE,
            "transforms[revenue].inputs.orders",
        ),
    );
    let msg = find_diag(&json, "ETL301")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("amount"), "names the column: {msg}");

    // The same port with a contract whose types agree is fine.
    p.write(
        "contracts/orders_v2.odcs.yaml",
        &ORDERS_AMOUNT_AS_STRING.replace(
            r#"{name: "amount", logicalType: "string", required: true}"#,
            r#"{name: "amount", logicalType: "number", required: true}"#,
        ),
    );
    p.run(&["validate"]).ok();
}

#[test]
fn unknown_asset_etl202() {
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "    asset: customer_revenue\n",
        "    asset: customer_revenu\n",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at(
            "ETL202",
            exit::INVALID_PIPELINE,
            "sinks[write_revenue].asset",
        ),
    );
    assert!(find_diag(&json, "ETL202")["help"]
        .as_str()
        .unwrap()
        .contains("customer_revenue"));
}

#[test]
fn asset_bound_to_nothing_etl203() {
    let p = Project::init();
    p.edit(
        "profiles/local.yaml",
        "  customer_revenue: file://out/customer_revenue.csv\n",
        "",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at(
            "ETL203",
            exit::INVALID_PIPELINE,
            "sinks[write_revenue].asset",
        ),
    );
    let d = find_diag(&json, "ETL203");
    assert!(
        d["help"].as_str().unwrap().contains("profiles/local.yaml"),
        "{d:#}"
    );
    assert!(d["message"].as_str().unwrap().contains("customer_revenue"));
}

#[test]
fn no_profile_at_all_leaves_every_asset_unbound_etl203() {
    let p = Project::init();
    std::fs::remove_dir_all(p.join("profiles")).unwrap();
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL203", exit::INVALID_PIPELINE, "sources[orders].asset"),
    );
    assert_eq!(error_codes(&json), vec!["ETL203", "ETL203"]);
}

#[test]
fn cycle_etl102() {
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "sinks:\n",
        "  - id: a\n    inputs: {x: b, o: orders}\n    steps: [{filter: \"true\"}]\n  - id: b\n    inputs: {x: a}\n    steps: [{filter: \"true\"}]\nsinks:\n  - id: write_a\n    input: a\n    asset: customer_revenue\n",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL102", exit::INVALID_PIPELINE, "transforms[a].inputs"),
    );
    let msg = find_diag(&json, "ETL102")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("a -> b -> a"), "{msg}");
}

#[test]
fn unknown_node_etl201() {
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "      orders: orders\n",
        "      orders: order\n",
    );
    assert_fails(
        &p,
        &[],
        Expect::at(
            "ETL201",
            exit::INVALID_PIPELINE,
            "transforms[revenue].inputs.orders",
        ),
    );
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "    input: revenue\n",
        "    input: revenu\n",
    );
    assert_fails(
        &p,
        &[],
        Expect::at(
            "ETL201",
            exit::INVALID_PIPELINE,
            "sinks[write_revenue].input",
        ),
    );
}

#[test]
fn duplicate_id_etl101() {
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "  - id: write_revenue\n",
        "  - id: orders\n",
    );
    assert_fails(
        &p,
        &[],
        Expect::at("ETL101", exit::INVALID_PIPELINE, "sinks[orders]"),
    );
}

#[test]
fn unknown_scheme_etl204() {
    let p = Project::init();
    p.edit(
        "profiles/local.yaml",
        "file://data/orders.jsonl",
        "gopher://example.org/orders",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL204", exit::INVALID_PIPELINE, "sources[orders].asset"),
    );
    assert!(find_diag(&json, "ETL204")["help"]
        .as_str()
        .unwrap()
        .contains("file"));
}

#[test]
fn implementation_count_etl107() {
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "    steps:\n",
        "    sql:\n      query: SELECT * FROM orders\n    steps:\n",
    );
    assert_fails(
        &p,
        &[],
        Expect::at("ETL107", exit::INVALID_PIPELINE, "transforms[revenue]"),
    );
}

#[test]
fn sink_contract_mismatch_etl305() {
    let p = Project::init();
    p.edit(
        "contracts/customer_revenue.odcs.yaml",
        "      - name: \"revenue\"\n        logicalType: \"number\"\n",
        "      - name: \"revenue\"\n        logicalType: \"date\"\n",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL305", exit::INVALID_PIPELINE, "sinks[write_revenue]"),
    );
    let msg = find_diag(&json, "ETL305")["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(msg.contains("revenue"), "{msg}");
}

// ---------------------------------------------------------------- load errors

#[test]
fn bad_yaml_etl002_has_the_line() {
    let p = Project::init();
    p.write(
        "pipeline.yaml",
        "apiVersion: etlantic/v1\nkind: Pipeline\nname: x\nassets:\n  orders:\n\tcontract: contracts/orders.odcs.yaml\n",
    );
    assert_fails(
        &p,
        &[],
        Expect::at("ETL002", exit::INVALID_PIPELINE, "")
            .no_path()
            .line(6),
    );
    p.write(
        "pipeline.yaml",
        "apiVersion: etlantic/v1\nkind: Pipeline\nname: x\n  indented: 1\n",
    );
    assert_fails(
        &p,
        &[],
        Expect::at("ETL002", exit::INVALID_PIPELINE, "")
            .no_path()
            .line(4),
    );
    // A profile with bad YAML is reported in the profile file.
    let p = Project::init();
    p.write(
        "profiles/local.yaml",
        "name: local\nbindings:\n\torders: file://data/orders.jsonl\n",
    );
    assert_fails(
        &p,
        &[],
        Expect::at("ETL002", exit::INVALID_PIPELINE, "")
            .no_path()
            .file("profiles/local.yaml")
            .line(3),
    );
}

#[test]
fn unknown_field_etl003() {
    // At the top level: the path is the field.
    let p = Project::init();
    p.edit("pipeline.yaml", "sources:\n", "sourcez:\n");
    assert_fails(
        &p,
        &[],
        Expect::at("ETL003", exit::INVALID_PIPELINE, "sourcez"),
    );
    // Inside a node: the path of the node, and the line.
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "    asset: orders\n",
        "    asset: orders\n    asste: orders\n",
    );
    let line = p
        .read("pipeline.yaml")
        .lines()
        .position(|l| l.contains("asste"))
        .unwrap() as u64
        + 1;
    assert_fails(
        &p,
        &[],
        Expect::at("ETL003", exit::INVALID_PIPELINE, "sources[0]").line(line),
    );
    // In a profile.
    let p = Project::init();
    p.edit("profiles/local.yaml", "bindings:", "bindngs:");
    assert_fails(
        &p,
        &[],
        Expect::at("ETL003", exit::INVALID_PIPELINE, "bindngs").file("profiles/local.yaml"),
    );
}

#[test]
fn invalid_odcs_contract_etl005() {
    let p = Project::init();
    p.edit(
        "contracts/orders.odcs.yaml",
        "id: \"orders\"",
        "identifier: \"orders\"",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL005", exit::INVALID_PIPELINE, "identifier")
            .file("contracts/orders.odcs.yaml"),
    );
    assert!(find_diag(&json, "ETL005")["message"]
        .as_str()
        .unwrap()
        .contains("identifier"));
}

#[test]
fn missing_contract_file_etl205() {
    let p = Project::init();
    std::fs::remove_file(p.join("contracts/customer_revenue.odcs.yaml")).unwrap();
    let json = assert_fails(
        &p,
        &[],
        Expect::at(
            "ETL205",
            exit::INVALID_PIPELINE,
            "assets.customer_revenue.contract",
        ),
    );
    assert!(find_diag(&json, "ETL205")["message"]
        .as_str()
        .unwrap()
        .contains("contracts/customer_revenue.odcs.yaml"));
}

// ---------------------------------------------------------------- guarantee and policy

#[test]
fn required_guarantee_unmet_etl601_is_a_planning_failure() {
    let p = Project::init();
    p.edit(
        "profiles/local.yaml",
        "file://out/customer_revenue.csv",
        "console://",
    );
    p.write(
        "profiles/local.yaml",
        &(p.read("profiles/local.yaml") + "require_guarantee: exactly_once\n"),
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL601", exit::PLANNING_FAILED, "sinks[write_revenue]"),
    );
    let d = find_diag(&json, "ETL601");
    assert_eq!(d["phase"], "guarantee");
    assert!(
        d["message"].as_str().unwrap().contains("exactly_once"),
        "{d:#}"
    );
    // Without the requirement the same pipeline plans, at least once.
    p.edit(
        "profiles/local.yaml",
        "require_guarantee: exactly_once\n",
        "",
    );
    let plan = p.run(&["plan"]);
    plan.ok();
    assert_eq!(
        plan.stdout_json()["guarantees"][0]["guarantee"],
        "at_least_once"
    );
}

#[test]
fn plain_text_password_in_a_binding_etl602() {
    let p = Project::init();
    p.edit(
        "profiles/local.yaml",
        "  customer_revenue: file://out/customer_revenue.csv\n",
        "  customer_revenue: file://out/customer_revenue.csv\n  warehouse: postgres://etl:Hunter2Plain@db.internal:5432/analytics\n",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL602", exit::INVALID_PIPELINE, "bindings.warehouse")
            .file("profiles/local.yaml"),
    );
    assert_eq!(find_diag(&json, "ETL602")["phase"], "policy");
    // The password itself is never printed.
    for fmt in ["human", "json", "sarif"] {
        let r = p.run(&["validate", "--format", fmt]);
        assert!(
            !r.all_output().contains("Hunter2Plain"),
            "{}",
            r.all_output()
        );
        let r = p.run(&["run", "--format", fmt]);
        assert!(
            !r.all_output().contains("Hunter2Plain"),
            "{}",
            r.all_output()
        );
    }
    // A plain secret in the `secrets:` table too.
    let p = Project::init();
    p.write(
        "profiles/local.yaml",
        &(p.read("profiles/local.yaml") + "secrets:\n  pg: Hunter2Plain\n"),
    );
    assert_fails(
        &p,
        &[],
        Expect::at("ETL602", exit::INVALID_PIPELINE, "secrets.pg").file("profiles/local.yaml"),
    );
}

// ---------------------------------------------------------------- transformations

#[test]
fn unknown_function_in_a_step_etl306() {
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "- filter: \"status != 'cancelled'\"",
        "- filter: \"frobnicate(status)\"",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL306", exit::INVALID_PIPELINE, "transforms[revenue]"),
    );
    assert!(find_diag(&json, "ETL306")["message"]
        .as_str()
        .unwrap()
        .contains("frobnicate"));
}

#[test]
fn function_the_backend_does_not_support_etl501_is_a_planning_failure() {
    // `dtcs:regex_match` is in the DTCS function registry, but DataFusion lacks it.
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "- filter: \"status != 'cancelled'\"",
        "- filter: \"regex_match(status, 'paid|shipped')\"",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL501", exit::PLANNING_FAILED, "transforms[revenue]"),
    );
    let d = find_diag(&json, "ETL501");
    assert_eq!(d["phase"], "capability");
    assert!(
        d["message"].as_str().unwrap().contains("dtcs:regex_match"),
        "{d:#}"
    );
}

#[test]
fn unknown_engine_override_is_reported() {
    let p = Project::init();
    p.write(
        "profiles/local.yaml",
        &(p.read("profiles/local.yaml") + "engines:\n  revenue: teradata\n"),
    );
    let r = p.run(&["validate", "--format", "json"]);
    assert_ne!(r.code, exit::OK);
    assert!(error_codes(&r.stdout_json()).contains(&"ETL502".to_string()));
    assert!(!p.exists("out"));
}

#[test]
fn a_dtcs_plan_reading_an_undeclared_port_etl208() {
    let p = plan_project("customer_totals", None, true);
    p.run(&["validate"]).ok();
    // The plan reads `orders`; the transformation declares `purchases` instead.
    let p = plan_project("customer_totals", Some(("orders", "purchases")), true);
    assert!(p.read("pipeline.yaml").contains("purchases: orders"));
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL208", exit::INVALID_PIPELINE, "transforms[step].inputs"),
    );
    let d = find_diag(&json, "ETL208");
    assert!(d["message"].as_str().unwrap().contains("`orders`"), "{d:#}");
    assert!(d["help"].as_str().unwrap().contains("purchases"), "{d:#}");
}

#[test]
fn missing_parameter_etl209() {
    let p = plan_project("filter_enrich_orders", None, true);
    p.run(&["validate"]).ok();
    let p = plan_project("filter_enrich_orders", None, false);
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL209", exit::INVALID_PIPELINE, "transforms[step]"),
    );
    assert!(find_diag(&json, "ETL209")["message"]
        .as_str()
        .unwrap()
        .contains("min_amount"));
}

#[test]
fn a_transform_plan_that_does_not_load_etl006() {
    let p = plan_project("customer_totals", None, true);
    p.edit(
        "plan.json",
        "dtcs.transform-plan/2",
        "dtcs.transform-plan/9",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at("ETL006", exit::INVALID_PIPELINE, "transforms[step].plan").file("plan.json"),
    );
    assert!(!error_codes(&json).is_empty());
}

#[test]
fn event_time_zone_must_match_the_contract_etl406() {
    let p = Project::init();
    p.edit(
        "pipeline.yaml",
        "  - id: orders\n    asset: orders\n",
        "  - id: orders\n    asset: orders\n    event_time: {column: ordered_at, timezone: Europe/Paris}\n",
    );
    let json = assert_fails(
        &p,
        &[],
        Expect::at(
            "ETL406",
            exit::INVALID_PIPELINE,
            "sources[orders].event_time.timezone",
        ),
    );
    assert!(find_diag(&json, "ETL406")["help"]
        .as_str()
        .unwrap()
        .contains("defaultTimezone: Europe/Paris"));
    // Declaring the zone on the contract column makes it valid.
    p.edit(
        "contracts/orders.odcs.yaml",
        "      - name: \"ordered_at\"\n        logicalType: \"timestamp\"\n",
        "      - name: \"ordered_at\"\n        logicalType: \"timestamp\"\n        logicalTypeOptions: {defaultTimezone: Europe/Paris}\n",
    );
    p.run(&["validate"]).ok();
}

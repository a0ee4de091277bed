//! Secrets referenced by a profile (`${env:NAME}`, and `${secret:NAME}` through the
//! profile's `secrets:` table) never appear in a plan, an explanation, a run report, the
//! quarantine or a log. The plan keeps the reference; the value exists only in the
//! child's environment.

mod common;

use common::*;
use etlantic::scaffold::EXPECTED_OUTPUT;

/// A value that cannot appear by chance.
const SECRET: &str = "s3cr3t-Xyzzy-42";

const ENV: &[(&str, &str)] = &[("SOME_PASSWORD", SECRET)];

/// The example project whose bindings and quarantine put the secret in their paths
/// (through the environment directly and through the `secrets:` table), plus a
/// postgres-style binding of an asset the pipeline does not use.
fn project() -> Project {
    let p = Project::init();
    p.write(
        "profiles/local.yaml",
        "apiVersion: etlantic/v1\n\
         kind: Profile\n\
         name: local\n\
         bindings:\n  \
           orders: file://data/${env:SOME_PASSWORD}/orders.jsonl\n  \
           customer_revenue: file://out/${secret:pw}/customer_revenue.csv\n  \
           warehouse: postgres://etl:${secret:pw}@db.internal:5432/analytics\n\
         quarantine: file://out/${secret:pw}/quarantine.jsonl\n\
         on_error: quarantine\n\
         secrets:\n  \
           pw: ${env:SOME_PASSWORD}\n",
    );
    let data = p.read("data/orders.jsonl");
    p.write(&format!("data/{SECRET}/orders.jsonl"), &data);
    std::fs::remove_file(p.join("data/orders.jsonl")).unwrap();
    p
}

#[track_caller]
fn assert_clean(what: &str, text: &str) {
    assert!(!text.contains(SECRET), "{what} leaks the secret:\n{text}");
}

#[test]
fn plan_keeps_the_reference_and_never_the_value() {
    let p = project();
    let r = p.run_env(&["plan", "-o", "plan.json"], ENV);
    r.ok();
    assert_clean("plan", &r.all_output());
    assert_clean("plan.json", &p.read("plan.json"));
    let plan: serde_json::Value = serde_json::from_str(&p.read("plan.json")).unwrap();
    assert_eq!(
        plan["assets"]["orders"]["binding"],
        "file://data/${env:SOME_PASSWORD}/orders.jsonl"
    );
    assert_eq!(
        plan["assets"]["customer_revenue"]["binding"],
        "file://out/${secret:pw}/customer_revenue.csv"
    );
    assert_eq!(
        plan["profile"]["quarantine"],
        "file://out/${secret:pw}/quarantine.jsonl"
    );
    assert_eq!(plan["profile"]["secrets"]["pw"], "${env:SOME_PASSWORD}");

    // The plan does not depend on the value: without it, or with another, same bytes.
    let without = p.run(&["plan"]);
    without.ok();
    assert_eq!(without.stdout.trim(), p.read("plan.json").trim());
    let other = p.run_env(&["plan"], &[("SOME_PASSWORD", "another")]);
    assert_eq!(other.stdout.trim(), p.read("plan.json").trim());

    for args in [
        &["validate"][..],
        &["validate", "--format", "json"],
        &["validate", "--format", "sarif"],
        &["explain"],
        &["explain", "--mermaid"],
        &["explain", "--plan", "plan.json"],
        &["generate", "dpcs", "-o", "generated"],
        &["generate", "odcs", "-o", "generated"],
        &["generate", "dtcs", "-o", "generated"],
    ] {
        let r = p.run_env(args, ENV);
        r.ok();
        assert_clean(&args.join(" "), &r.all_output());
    }
    let explain = p.run_env(&["explain"], ENV);
    assert!(
        explain.stdout.contains("${env:SOME_PASSWORD}"),
        "{}",
        explain.stdout
    );
    for entry in walk(&p.join("generated")) {
        assert_clean(
            &entry.display().to_string(),
            &std::fs::read_to_string(&entry).unwrap(),
        );
    }
}

#[test]
fn run_report_quarantine_and_logs_never_show_the_value() {
    let p = project();
    let r = p.run_env(&["run", "--format", "json"], ENV);
    r.ok();
    assert_clean("run --format json", &r.all_output());
    let report = r.stdout_json();
    assert_eq!(report["quarantined"], 2);
    assert_eq!(report["quarantine"], "out/${secret:pw}/quarantine.jsonl");

    // The run really used the value: the data and outputs live under the secret path.
    let out = format!("out/{SECRET}");
    assert_eq!(
        p.read(&format!("{out}/customer_revenue.csv")),
        EXPECTED_OUTPUT
    );
    let quarantine = p.read(&format!("{out}/quarantine.jsonl"));
    assert_clean("quarantine", &quarantine);
    let q = jsonl(&quarantine);
    assert_eq!(q.len(), 2);
    assert_eq!(q[0]["position"]["file"], "data/***/orders.jsonl");
    assert_eq!(q[0]["position"]["line"], 6);
    assert_eq!(q[1]["position"]["line"], 8);

    let r = p.run_env(&["run"], ENV);
    r.ok();
    assert_clean("run", &r.all_output());
    let r = p.run_env(&["plan", "-o", "plan.json"], ENV);
    r.ok();
    let r = p.run_env(&["run", "--plan", "plan.json", "--format", "json"], ENV);
    r.ok();
    assert_clean("run --plan", &r.all_output());
    assert_clean("quarantine", &p.read(&format!("{out}/quarantine.jsonl")));
}

#[test]
fn a_failing_run_does_not_show_the_value_in_its_errors() {
    let p = project();
    // The secret resolves, but the directory it names does not exist: an I/O error
    // whose message would carry the resolved path.
    std::fs::rename(p.join(&format!("data/{SECRET}")), p.join("data/elsewhere")).unwrap();
    for format in ["human", "json", "sarif"] {
        let r = p.run_env(&["run", "--format", format], ENV);
        r.expect_code(exit::EXECUTION_FAILED);
        assert_clean(&format!("failed run ({format})"), &r.all_output());
    }
    let r = p.run_env(&["run", "--format", "json"], ENV);
    let report = r.stdout_json();
    assert_eq!(report["status"], "failed");
    assert!(!report["errors"].as_array().unwrap().is_empty());

    // Without the variable the run stops with ETL207, naming the variable only.
    let r = p.run(&["run", "--format", "json"]);
    r.expect_code(exit::EXECUTION_FAILED);
    let report = r.stdout_json();
    assert_eq!(report["errors"][0]["code"], "ETL207", "{report:#}");
    assert!(report["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("SOME_PASSWORD"));
    assert!(!p.exists(&format!("out/{SECRET}/customer_revenue.csv")));
}

#[test]
fn a_postgres_binding_with_a_secret_reference_is_reported_by_reference() {
    let p = project();
    // A postgres binding the SQL sink refuses (no `?table=`): the diagnostic shows the
    // reference, never the value.
    p.edit(
        "profiles/local.yaml",
        "customer_revenue: file://out/${secret:pw}/customer_revenue.csv",
        "customer_revenue: postgres://etl:${secret:pw}@db.internal:5432/analytics",
    );
    for args in [
        &["validate", "--format", "json"][..],
        &["plan"],
        &["run", "--format", "json"],
    ] {
        let r = p.run_env(args, ENV);
        assert_ne!(r.code, exit::OK);
        assert_clean(&args.join(" "), &r.all_output());
    }
    let r = p.run_env(&["validate", "--format", "json"], ENV);
    r.expect_code(exit::INVALID_PIPELINE);
    let d = find_diag(&r.stdout_json(), "ETL007");
    assert_eq!(d["path"], "sinks[write_revenue]");
    assert!(
        d["message"].as_str().unwrap().contains("${secret:pw}"),
        "{d}"
    );

    // A complete binding to a server that does not exist: planning succeeds, the run
    // fails to connect, and nothing printed holds the password.
    p.edit(
        "profiles/local.yaml",
        "postgres://etl:${secret:pw}@db.internal:5432/analytics",
        "postgres://etl:${secret:pw}@127.0.0.1:9/analytics?table=revenue",
    );
    p.run_env(&["plan"], ENV).expect_code(exit::OK);
    let r = p.run_env(&["run", "--format", "json"], ENV);
    r.expect_code(exit::EXECUTION_FAILED);
    assert_clean("run (connection refused)", &r.all_output());
}

/// Credentials written in plain text in an option (`?kafka.sasl.password=...`, any
/// option named like a password, secret, token or key) or a Spark Connect endpoint
/// (`sc://host/;token=...`) used to reach plan.json, `explain` and progress records. They
/// are refused (ETL602 at their path, pointing to `${secret:...}`), and the diagnostic
/// itself shows them redacted; written as references they plan, and explain and the plan
/// keep the reference.
#[test]
fn plain_credentials_in_options_and_endpoints_are_refused_and_redacted() {
    const PLAIN: &str = "hunter2-Plain-99";
    let cases = [
        (
            "customer_revenue: file://out/customer_revenue.csv",
            format!("customer_revenue: kafka://broker:9092/revenue?kafka.sasl.password={PLAIN}"),
            "bindings.customer_revenue",
            "kafka.sasl.password",
        ),
        (
            "customer_revenue: file://out/customer_revenue.csv",
            format!("customer_revenue: kafka://broker:9092/revenue?kafka.sasl.oauthbearer.client.secret={PLAIN}&key=customer"),
            "bindings.customer_revenue",
            "kafka.sasl.oauthbearer.client.secret",
        ),
        (
            "on_error: quarantine",
            format!("on_error: quarantine\nendpoints:\n  spark: sc://spark.internal:15002/;token={PLAIN}"),
            "endpoints.spark",
            "token",
        ),
    ];
    for (from, to, path, option) in &cases {
        let p = Project::init();
        p.edit("profiles/local.yaml", from, to);
        for args in [
            &["validate", "--format", "json"][..],
            &["validate"],
            &["plan", "-o", "plan.json"],
            &["explain"],
            &["run", "--format", "json"],
        ] {
            let r = p.run(args);
            assert_eq!(
                r.code,
                exit::INVALID_PIPELINE,
                "{args:?}: {}",
                r.all_output()
            );
            assert!(
                !r.all_output().contains(PLAIN),
                "{args:?} shows the credential:\n{}",
                r.all_output()
            );
        }
        assert!(!p.exists("plan.json"));
        let json = p.run(&["validate", "--format", "json"]).stdout_json();
        let d = find_diag(&json, "ETL602");
        assert_eq!(d["path"], *path, "{d}");
        let message = d["message"].as_str().unwrap();
        assert!(message.contains(option) && message.contains("***"), "{d}");
        assert!(d["help"].as_str().unwrap().contains("${secret:"), "{d}");

        // As a reference it plans, and the plan and explain keep the reference.
        p.edit("profiles/local.yaml", PLAIN, "${secret:cred}");
        let profile = p.read("profiles/local.yaml");
        p.write(
            "profiles/local.yaml",
            &format!("{profile}secrets:\n  cred: ${{env:SOME_PASSWORD}}\n"),
        );
        let r = p.run_env(&["plan", "-o", "plan.json"], ENV);
        r.ok();
        assert_clean("plan", &p.read("plan.json"));
        if path.starts_with("bindings.") {
            assert!(p.read("plan.json").contains("${secret:cred}"));
        }
        let r = p.run_env(&["explain"], ENV);
        r.ok();
        assert_clean("explain", &r.all_output());
    }
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            out.extend(walk(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

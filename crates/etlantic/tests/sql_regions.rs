//! Placing transformations on other backends through the profile's `engines:` overrides,
//! end to end through the real `etlantic` binary: an SQL region inside an SQLite file and
//! inside PostgreSQL (the server on 127.0.0.1:5432, database `test`), a Polars region
//! between two DataFusion regions — each gives the same output file as the pipeline all
//! on DataFusion — and the plans (`explain`) record the regions, the database each SQL
//! region runs in and what every transition materialises. The planner refuses an SQL
//! region with no database (`ETL506`) and a stateful streaming step on an SQL backend
//! (`ETL404`).

use serde_json::Value;
use sqlx::Connection;
use std::path::Path;
use std::process::{Command, Output};

const PG: &str = "postgres://postgres@127.0.0.1:5432/test";

const PIPELINE: &str = r#"apiVersion: etlantic/v1
kind: Pipeline
name: customer_revenue
assets:
  orders: {contract: contracts/orders.yaml}
  revenue: {contract: contracts/revenue.yaml}
sources:
  - id: orders
    asset: orders
transforms:
  - id: paid
    inputs: {orders: orders}
    steps:
      - filter: "status != 'cancelled'"
  - id: per_customer
    inputs: {paid: paid}
    steps:
      - aggregate:
          group_by: [customer]
          aggregates: {orders: "count_all()", revenue: "sum(amount)"}
  - id: report
    inputs: {totals: per_customer}
    steps:
      - with_columns: {avg_order: "revenue / orders", big: "revenue >= 20"}
      - sort: [customer]
sinks:
  - id: write_revenue
    input: report
    asset: revenue
"#;

const ORDERS: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
name: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - {name: "order_id", logicalType: "integer", logicalTypeOptions: {format: "i64"}, required: true}
      - {name: "customer", logicalType: "string", required: true}
      - {name: "amount", logicalType: "number"}
      - {name: "status", logicalType: "string"}
"#;

const REVENUE: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "revenue"
name: "revenue"
status: "active"
schema:
  - name: "revenue"
    logicalType: "object"
    properties:
      - {name: "customer", logicalType: "string"}
      - {name: "orders", logicalType: "integer", logicalTypeOptions: {format: "i64"}}
      - {name: "revenue", logicalType: "number"}
      - {name: "avg_order", logicalType: "number"}
      - {name: "big", logicalType: "boolean"}
"#;

/// The orders; `amount` of order 4 is not a number (quarantined by the source), order 3
/// is cancelled, order 6 has no amount.
const ROWS: &str = "(1, 'acme', 10.5, 'paid'), (2, 'acme', 12.25, 'shipped'), (3, 'globex', 100.0, 'cancelled'), (4, 'globex', 'lots', 'paid'), (5, 'globex', 7.75, 'paid'), (6, 'initech', NULL, 'paid'), (7, 'initech', 2.5, NULL)";

/// What every placement must write: avg = revenue / orders; `initech`'s null amount
/// counts as an order but not in the sum; its null status is not `!= 'cancelled'`.
const EXPECTED: &str =
    "customer,orders,revenue,avg_order,big\nacme,2,22.75,11.375,true\nglobex,1,7.75,7.75,false\ninitech,1,,,\n";

struct Project {
    tmp: tempfile::TempDir,
}

impl Project {
    fn new(orders_binding: &str, revenue_binding: &str, engines: &[(&str, &str)]) -> Project {
        let tmp = tempfile::tempdir().unwrap();
        let p = Project { tmp };
        p.write("pipeline.yaml", PIPELINE);
        p.write("contracts/orders.yaml", ORDERS);
        p.write("contracts/revenue.yaml", REVENUE);
        let mut profile = format!(
            "apiVersion: etlantic/v1\nkind: Profile\nname: local\nmode: batch\nquarantine: file://out/quarantine.jsonl\nbindings:\n  orders: {orders_binding}\n  revenue: {revenue_binding}\n"
        );
        if !engines.is_empty() {
            profile.push_str("engines:\n");
            for (t, b) in engines {
                profile.push_str(&format!("  {t}: {b}\n"));
            }
        }
        p.write("profiles/local.yaml", &profile);
        p
    }

    fn dir(&self) -> &Path {
        self.tmp.path()
    }

    fn write(&self, path: &str, text: &str) {
        let f = self.dir().join(path);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap();
    }

    fn etlantic(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_etlantic"))
            .current_dir(self.dir())
            .args(args)
            .output()
            .unwrap()
    }

    fn explain(&self) -> String {
        let o = self.etlantic(&["explain", "pipeline.yaml"]);
        assert!(o.status.success(), "{}", describe(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    fn run_ok(&self) -> Value {
        let o = self.etlantic(&["run", "pipeline.yaml", "--format", "json"]);
        assert!(o.status.success(), "{}", describe(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn read(&self, path: &str) -> String {
        std::fs::read_to_string(self.dir().join(path)).unwrap()
    }

    async fn sqlite_orders(&self) {
        let db = self.dir().join("data/shop.db");
        std::fs::create_dir_all(db.parent().unwrap()).unwrap();
        let o = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&db)
            .create_if_missing(true);
        let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
        sqlx::raw_sql(&format!(
            "CREATE TABLE orders (order_id INTEGER, customer TEXT, amount REAL, status TEXT); INSERT INTO orders VALUES {ROWS};"
        ))
        .execute(&mut c)
        .await
        .unwrap();
        c.close().await.unwrap();
    }
}

fn describe(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

async fn pg_exec(sql: &str) {
    let mut c = sqlx::PgConnection::connect(PG)
        .await
        .expect("PostgreSQL on 127.0.0.1:5432 (run `cargo xtask setup`)");
    sqlx::raw_sql(sql).execute(&mut c).await.unwrap();
}

fn assert_lines(text: &str, lines: &[&str]) {
    for l in lines {
        assert!(text.contains(l), "`{l}` in\n{text}");
    }
}

#[tokio::test]
async fn an_sql_region_runs_inside_the_sqlite_file_of_its_source() {
    let reference = Project::new(
        "sqlite://data/shop.db?table=orders",
        "file://out/revenue.csv",
        &[],
    );
    reference.sqlite_orders().await;
    let report = reference.run_ok();
    assert_eq!(reference.read("out/revenue.csv"), EXPECTED);
    assert_eq!(report["quarantined"], 1, "{report}");

    let p = Project::new(
        "sqlite://data/shop.db?table=orders",
        "file://out/revenue.csv",
        &[
            ("paid", "sqlite"),
            ("per_customer", "sqlite"),
            ("report", "sqlite"),
        ],
    );
    p.sqlite_orders().await;
    assert_lines(
        &p.explain(),
        &[
            "r0 (Sql on sqlite in sqlite://data/shop.db): reads [orders], hands on [report]",
            "source:orders → region:r0: orders (arrow→staged-table)",
            "region:r0 → sink:write_revenue: report (query-result→arrow)",
        ],
    );
    let report = p.run_ok();
    assert_eq!(p.read("out/revenue.csv"), EXPECTED);
    assert_eq!(
        report["quarantined"], 1,
        "the source's contract still applies"
    );
    // The region staged its input in temporary tables and rolled back: the file holds
    // only its table.
    let o = sqlx::sqlite::SqliteConnectOptions::new().filename(p.dir().join("data/shop.db"));
    let mut c = sqlx::SqliteConnection::connect_with(&o).await.unwrap();
    let tables: Vec<(String,)> =
        sqlx::query_as("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
            .fetch_all(&mut c)
            .await
            .unwrap();
    assert_eq!(tables, [("orders".to_string(),)]);
}

#[tokio::test]
async fn an_sql_region_runs_inside_postgresql_between_its_source_and_sink() {
    let schema = format!("etl_regions_{}", std::process::id());
    pg_exec(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
         CREATE TABLE {schema}.orders (order_id BIGINT, customer TEXT, amount TEXT, status TEXT);
         INSERT INTO {schema}.orders VALUES {};",
        ROWS.replace(", 10.5,", ", '10.5',")
            .replace(", 12.25,", ", '12.25',")
            .replace(", 100.0,", ", '100.0',")
            .replace(", 7.75,", ", '7.75',")
            .replace(", 2.5,", ", '2.5',")
    ))
    .await;
    let orders = format!("{PG}?table={schema}.orders");
    let revenue = format!("{PG}?table={schema}.revenue&mode=overwrite");
    // `paid` reads the PostgreSQL source: its region runs in that database; `report`
    // feeds the PostgreSQL sink. `per_customer` stays on DataFusion in between.
    let p = Project::new(
        &orders,
        &revenue,
        &[("paid", "postgres"), ("report", "postgres")],
    );
    let text = p.explain();
    assert_lines(
        &text,
        &[
            "r0 (Sql on postgres in postgres://postgres@127.0.0.1:5432/test): reads [orders], hands on [paid]",
            "r1 (Batch on datafusion): reads [paid], hands on [per_customer]",
            "r2 (Sql on postgres in postgres://postgres@127.0.0.1:5432/test): reads [per_customer], hands on [report]",
            "source:orders → region:r0: orders (arrow→staged-table)",
            "region:r0 → region:r1: paid (query-result→arrow)",
            "region:r1 → region:r2: per_customer (arrow→staged-table)",
            "region:r2 → sink:write_revenue: report (query-result→arrow)",
        ],
    );
    let report = p.run_ok();
    assert_eq!(report["quarantined"], 1, "{report}");
    let mut c = sqlx::PgConnection::connect(PG).await.unwrap();
    type Row = (String, i64, Option<f64>, Option<f64>, Option<bool>);
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT customer, orders, revenue, avg_order, big FROM {schema}.revenue ORDER BY customer"
    ))
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(
        rows,
        [
            ("acme".into(), 2, Some(22.75), Some(11.375), Some(true)),
            ("globex".into(), 1, Some(7.75), Some(7.75), Some(false)),
            ("initech".into(), 1, None, None, None),
        ]
    );
    // Nothing but the source and sink tables is left in the schema.
    let tables: Vec<(String,)> = sqlx::query_as(&format!(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = '{schema}' ORDER BY 1"
    ))
    .fetch_all(&mut c)
    .await
    .unwrap();
    assert_eq!(tables, [("orders".into(),), ("revenue".into(),)]);
    pg_exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
}

#[tokio::test]
async fn a_polars_region_between_two_datafusion_regions_gives_the_same_output() {
    let p = Project::new(
        "sqlite://data/shop.db?table=orders",
        "file://out/revenue.csv",
        &[("per_customer", "polars")],
    );
    p.sqlite_orders().await;
    assert_lines(
        &p.explain(),
        &[
            "r0 (Batch on datafusion): reads [orders], hands on [paid]",
            "r1 (Batch on polars): reads [paid], hands on [per_customer]",
            "r2 (Batch on datafusion): reads [per_customer], hands on [report]",
            "region:r0 → region:r1: paid (arrow)",
            "region:r1 → region:r2: per_customer (arrow)",
        ],
    );
    p.run_ok();
    assert_eq!(p.read("out/revenue.csv"), EXPECTED);
}

/// The same transformation on real Spark (a local Spark Connect server): the profile
/// places it with `engines:` and names the endpoint with `endpoints:`.
#[tokio::test]
async fn a_spark_region_between_two_datafusion_regions_gives_the_same_output() {
    let server = etlantic_spark_compat::local::LocalSparkConnect::start()
        .expect("a local Spark Connect server (`cargo xtask setup` installs pyspark)");
    let p = Project::new(
        "sqlite://data/shop.db?table=orders",
        "file://out/revenue.csv",
        &[("per_customer", "spark")],
    );
    let profile = p.read("profiles/local.yaml");
    p.write(
        "profiles/local.yaml",
        &format!("{profile}endpoints:\n  spark: {}\n", server.url()),
    );
    p.sqlite_orders().await;
    let spark_region = format!(
        "r1 (Batch on spark in {}): reads [paid], hands on [per_customer]",
        server.url()
    );
    assert_lines(
        &p.explain(),
        &[
            "r0 (Batch on datafusion): reads [orders], hands on [paid]",
            &spark_region,
            "r2 (Batch on datafusion): reads [per_customer], hands on [report]",
        ],
    );
    p.run_ok();
    assert_eq!(p.read("out/revenue.csv"), EXPECTED);
}

/// A step on Spark with no endpoint in the profile is refused when planning, with a
/// hint naming `endpoints:`.
#[test]
fn a_spark_region_without_an_endpoint_is_refused() {
    let p = Project::new(
        "file://data/orders.jsonl",
        "file://out/revenue.csv",
        &[("per_customer", "spark")],
    );
    p.write("data/orders.jsonl", "");
    let o = p.etlantic(&["plan", "pipeline.yaml", "--format", "json"]);
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(text.contains("ETL506"), "{text}");
    assert!(text.contains("endpoints:"), "{text}");
}

#[test]
fn a_postgres_region_without_a_postgres_asset_has_no_database() {
    let p = Project::new(
        "file://data/orders.jsonl",
        "file://out/revenue.csv",
        &[("report", "postgres")],
    );
    p.write("data/orders.jsonl", "");
    let o = p.etlantic(&["plan", "pipeline.yaml", "--format", "json"]);
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(text.contains("ETL506"), "{text}");
    assert!(text.contains("engines.report"), "{text}");
}

#[test]
fn a_stateful_streaming_step_on_an_sql_backend_is_refused() {
    let p = Project::new(
        "file://in?format=jsonl",
        "sqlite://out/revenue.db?table=revenue",
        &[("per_customer", "sqlite")],
    );
    p.write(
        "profiles/local.yaml",
        &p.read("profiles/local.yaml").replace(
            "mode: batch",
            "mode: streaming\ntrigger: available_now\ncheckpoint: file://chk",
        ),
    );
    p.write(
        "pipeline.yaml",
        &PIPELINE
            .replace(
                "    input: report\n",
                "    input: report\n    output_mode: complete\n",
            )
            .replace("      - sort: [customer]\n", ""),
    );
    let o = p.etlantic(&["plan", "pipeline.yaml", "--format", "json"]);
    assert!(!o.status.success(), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(text.contains("ETL404"), "{text}");
    assert!(text.contains("engines.per_customer"), "{text}");
}

/// `read=in_place`: the SQL region reads the PostgreSQL table where it lies — no row of
/// it passes through ETLantic — and the output is the same. The database's types are the
/// check there: a value that does not convert fails the run instead of being guessed.
#[tokio::test]
async fn an_sql_region_reads_a_postgres_table_in_place() {
    let schema = format!("etl_in_place_{}", std::process::id());
    let good_rows = ROWS.replace(", (4, 'globex', 'lots', 'paid')", "");
    pg_exec(&format!(
        "DROP SCHEMA IF EXISTS {schema} CASCADE; CREATE SCHEMA {schema};
         CREATE TABLE {schema}.orders (order_id BIGINT, customer TEXT, amount NUMERIC(10,2), status TEXT);
         INSERT INTO {schema}.orders VALUES {good_rows};
         CREATE TABLE {schema}.bad_orders (order_id BIGINT, customer TEXT, amount TEXT, status TEXT);
         INSERT INTO {schema}.bad_orders VALUES (1, 'acme', 'lots', 'paid');"
    ))
    .await;
    let orders = format!("{PG}?table={schema}.orders&read=in_place");
    let p = Project::new(
        &orders,
        "file://out/revenue.csv",
        &[
            ("paid", "postgres"),
            ("per_customer", "postgres"),
            ("report", "postgres"),
        ],
    );
    assert_lines(
        &p.explain(),
        &[
            "r0 (Sql on postgres in postgres://postgres@127.0.0.1:5432/test): reads [orders], hands on [report]",
            "source:orders → region:r0: orders (in-place)",
            "region:r0 → sink:write_revenue: report (query-result→arrow)",
        ],
    );
    let report = p.run_ok();
    assert_eq!(p.read("out/revenue.csv"), EXPECTED);
    assert_eq!(report["quarantined"], 0, "{report}");
    assert!(
        report["sources"].as_array().unwrap().is_empty(),
        "no source read a row: {report}"
    );

    // A text that is not a number fails the region's query, with the database's reason.
    let bad = Project::new(
        &format!("{PG}?table={schema}.bad_orders&read=in_place"),
        "file://out/revenue.csv",
        &[
            ("paid", "postgres"),
            ("per_customer", "postgres"),
            ("report", "postgres"),
        ],
    );
    let o = bad.etlantic(&["run", "pipeline.yaml"]);
    assert_eq!(o.status.code(), Some(4), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        text.contains("ETL707") && text.contains("lots") && text.contains("read=in_place"),
        "{text}"
    );

    // A reader outside the database's SQL region: the rows must be read after all.
    let mixed = Project::new(&orders, "file://out/revenue.csv", &[("report", "postgres")]);
    let o = mixed.etlantic(&["plan", "pipeline.yaml", "--format", "json"]);
    assert_eq!(o.status.code(), Some(3), "{}", describe(&o));
    let text = String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
    assert!(text.contains("ETL506") && text.contains("`paid`"), "{text}");
    pg_exec(&format!("DROP SCHEMA {schema} CASCADE")).await;
}

/// The main job (`etlantic init`'s project, what `cargo xtask demo` runs) on every
/// backend that can run its transformation where it is: DataFusion, Polars, and an SQL
/// region in SQLite (a private in-memory database: its assets are files). Same output,
/// same quarantine.
#[test]
fn the_init_project_gives_the_same_output_on_every_backend() {
    for engine in [None, Some("polars"), Some("sqlite")] {
        let tmp = tempfile::tempdir().unwrap();
        for (path, text) in etlantic::scaffold::FILES {
            let f = tmp.path().join(path);
            std::fs::create_dir_all(f.parent().unwrap()).unwrap();
            let mut text = text.to_string();
            if let (Some(e), true) = (engine, *path == "profiles/local.yaml") {
                text.push_str(&format!("engines:\n  revenue: {e}\n"));
            }
            std::fs::write(f, text).unwrap();
        }
        let run = |args: &[&str]| {
            Command::new(env!("CARGO_BIN_EXE_etlantic"))
                .current_dir(tmp.path())
                .args(args)
                .output()
                .unwrap()
        };
        let o = run(&["explain"]);
        let text = String::from_utf8_lossy(&o.stdout);
        let backend = engine.unwrap_or("datafusion");
        assert!(
            text.contains(&format!("on {backend}")),
            "{engine:?}: {text}"
        );
        let o = run(&["run", "--format", "json"]);
        assert!(o.status.success(), "{engine:?}: {}", describe(&o));
        let report: Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(report["quarantined"], 2, "{engine:?}: {report}");
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("out/customer_revenue.csv")).unwrap(),
            etlantic::scaffold::EXPECTED_OUTPUT,
            "{engine:?}"
        );
    }
}

//! `etlantic init`: a runnable example project on embedded defaults.
//!
//! The batch example ([`Template::Batch`]) reads orders (JSON lines, two of which break
//! the contract on purpose), drops cancelled ones, and writes revenue per customer to a
//! CSV file; the bad records land in `out/quarantine.jsonl` with their reason and line
//! number.
//!
//! The streaming example ([`Template::Streaming`]) counts page views per page in
//! 5-minute event-time windows from a directory of JSON-lines files that arrive in two
//! steps: `data/views/` holds the first two files; `samples/step2/` the third, to be moved
//! in between two runs. Event time with a 1-minute watermark, late views and bad records
//! quarantined, append output of each window once the watermark closes it, a checkpoint
//! that carries the query from the first run to the second.

use etlantic_core::diagnostics::{codes, Error, Result};
use std::path::{Path, PathBuf};

/// The files `init` writes, relative to the project directory.
pub const FILES: &[(&str, &str)] = &[
    ("pipeline.yaml", PIPELINE),
    ("contracts/orders.odcs.yaml", ORDERS_CONTRACT),
    ("contracts/customer_revenue.odcs.yaml", REVENUE_CONTRACT),
    ("profiles/local.yaml", PROFILE),
    ("data/orders.jsonl", ORDERS_DATA),
    (".gitignore", "out/\n.etlantic/\n"),
];

/// The expected content of `out/customer_revenue.csv` after `etlantic run`.
pub const EXPECTED_OUTPUT: &str =
    "customer,orders,revenue\nacme,3,245.5\nglobex,2,80.0\ninitech,1,19.99\n";

const PIPELINE: &str = r#"# An ETLantic pipeline: assets with contracts, sources, transformations, sinks.
# Where the assets live is the profile's business (profiles/local.yaml).
apiVersion: etlantic/v1
kind: Pipeline
name: customer_revenue
description: Revenue and order count per customer, from orders that were not cancelled.
assets:
  orders:
    contract: contracts/orders.odcs.yaml
  customer_revenue:
    contract: contracts/customer_revenue.odcs.yaml
sources:
  - id: orders
    asset: orders
transforms:
  - id: revenue
    inputs:
      orders: orders
    steps:
      - filter: "status != 'cancelled'"
      - aggregate:
          group_by: [customer]
          aggregates:
            orders: "count_all()"
            revenue: "sum(amount)"
      - sort: [customer]
sinks:
  - id: write_revenue
    input: revenue
    asset: customer_revenue
"#;

const ORDERS_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
name: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - name: "order_id"
        logicalType: "integer"
        logicalTypeOptions: {minimum: 1}
        required: true
        unique: true
      - name: "customer"
        logicalType: "string"
        required: true
      - name: "amount"
        logicalType: "number"
        required: true
      - name: "status"
        logicalType: "string"
        required: true
      - name: "ordered_at"
        logicalType: "timestamp"
"#;

const REVENUE_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "customer_revenue"
name: "customer_revenue"
status: "active"
schema:
  - name: "customer_revenue"
    logicalType: "object"
    properties:
      - name: "customer"
        logicalType: "string"
        required: true
      - name: "orders"
        logicalType: "integer"
        required: true
      - name: "revenue"
        logicalType: "number"
"#;

const PROFILE: &str = r#"# Binds the pipeline's logical assets to places, for local runs.
apiVersion: etlantic/v1
kind: Profile
name: local
bindings:
  orders: file://data/orders.jsonl
  customer_revenue: file://out/customer_revenue.csv
quarantine: file://out/quarantine.jsonl
on_error: quarantine
"#;

const ORDERS_DATA: &str = r#"{"order_id": 1, "customer": "acme", "amount": 120.5, "status": "paid", "ordered_at": "2024-01-01T10:00:00Z"}
{"order_id": 2, "customer": "globex", "amount": 30.0, "status": "paid", "ordered_at": "2024-01-01T10:05:00Z"}
{"order_id": 3, "customer": "acme", "amount": 99.0, "status": "cancelled", "ordered_at": "2024-01-01T10:07:00Z"}
{"order_id": 4, "customer": "acme", "amount": 25.0, "status": "shipped", "ordered_at": "2024-01-01T11:00:00Z"}
{"order_id": 5, "customer": "initech", "amount": 19.99, "status": "paid", "ordered_at": "2024-01-01T11:30:00Z"}
{"order_id": 6, "customer": "globex", "amount": "fifty", "status": "paid", "ordered_at": "2024-01-01T12:00:00Z"}
{"order_id": 7, "customer": "globex", "amount": 50.0, "status": "paid", "ordered_at": "2024-01-01T12:10:00Z"}
{"order_id": 8, "customer": "acme", "amount": 100.0, "status": "paid", "ordered_at": "2024-01-01T12:30:00Z"
{"order_id": 9, "customer": "acme", "amount": 100.0, "status": "paid", "ordered_at": "2024-01-01T13:00:00Z"}
"#;

/// Which example `etlantic init` writes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Template {
    /// Orders to revenue per customer, one batch run.
    #[default]
    Batch,
    /// Page views per page in 5-minute windows, a streaming query run in two steps.
    Streaming,
}

impl Template {
    /// The files the template writes, relative to the project directory.
    pub fn files(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Template::Batch => FILES,
            Template::Streaming => STREAMING_FILES,
        }
    }
}

/// The files of the streaming template.
pub const STREAMING_FILES: &[(&str, &str)] = &[
    ("pipeline.yaml", STREAMING_PIPELINE),
    ("contracts/page_views.odcs.yaml", VIEWS_CONTRACT),
    ("contracts/views_per_page.odcs.yaml", PER_PAGE_CONTRACT),
    ("profiles/local.yaml", STREAMING_PROFILE),
    ("data/views/001.jsonl", VIEWS_1),
    ("data/views/002.jsonl", VIEWS_2),
    ("samples/step2/003.jsonl", VIEWS_3),
    ("README.md", STREAMING_README),
    (".gitignore", "out/\n.etlantic/\n"),
];

/// The windows the streaming template's sink holds after the first run (step 1), as
/// `window_start page views` lines sorted.
pub const STREAMING_EXPECTED_STEP1: &[&str] = &["10:00 /home 3", "10:00 /pricing 1"];

/// The windows after the second run (step 2), sorted.
pub const STREAMING_EXPECTED_STEP2: &[&str] = &[
    "10:00 /home 3",
    "10:00 /pricing 1",
    "10:05 /docs 1",
    "10:05 /home 1",
    "10:05 /pricing 1",
    "10:10 /docs 1",
    "10:10 /home 1",
];

const STREAMING_PIPELINE: &str = r#"# A streaming ETLantic pipeline: page views per page in 5-minute event-time windows.
# Where the assets live, the trigger and the checkpoint are the profile's business.
apiVersion: etlantic/v1
kind: Pipeline
name: views_per_page
description: Page views per page and 5-minute window, from view events in JSON lines.
assets:
  page_views:
    contract: contracts/page_views.odcs.yaml
  views_per_page:
    contract: contracts/views_per_page.odcs.yaml
sources:
  - id: views
    asset: page_views
    event_time: {column: ts}
    # A window closes once no view older than a minute behind the newest is expected.
    watermark: 1 minute
    # Views older than that go to the quarantine with code ETL708, not lost.
    late_events: {policy: quarantine}
    # One file per micro-batch, so the watermark's progress shows.
    read_limit: {max_files: 1}
transforms:
  - id: per_page
    inputs:
      views: views
    steps:
      - window_aggregate:
          window: {type: tumbling, column: ts, size: 5 minutes}
          group_by: [page]
          aggregates: {views: "count_all()"}
sinks:
  - id: write_per_page
    input: per_page
    asset: views_per_page
    # Each window once, when the watermark has passed its end.
    output_mode: append
"#;

const VIEWS_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "page_views"
name: "page_views"
status: "active"
schema:
  - name: "page_views"
    logicalType: "object"
    properties:
      - name: "ts"
        logicalType: "timestamp"
        required: true
      - name: "page"
        logicalType: "string"
        required: true
      - name: "user"
        logicalType: "string"
"#;

const PER_PAGE_CONTRACT: &str = r#"version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "views_per_page"
name: "views_per_page"
status: "active"
schema:
  - name: "views_per_page"
    logicalType: "object"
    properties:
      - name: "window_start"
        logicalType: "timestamp"
      - name: "window_end"
        logicalType: "timestamp"
      - name: "page"
        logicalType: "string"
      - name: "views"
        logicalType: "integer"
        logicalTypeOptions: {format: "i64"}
"#;

const STREAMING_PROFILE: &str = r#"# Binds the pipeline's assets to local places and runs it as a streaming query.
apiVersion: etlantic/v1
kind: Profile
name: local
application_id: views-local
mode: streaming
# Process everything there is, then stop; the next run goes on from the checkpoint.
# (`processing_time 10 seconds` keeps it running instead.)
trigger: available_now
checkpoint: file://.etlantic/checkpoints/views_per_page
bindings:
  page_views: file://data/views/?format=jsonl
  views_per_page: file://out/views_per_page/?format=jsonl
quarantine: file://out/quarantine.jsonl
on_error: quarantine
"#;

const VIEWS_1: &str = r#"{"ts": "2024-05-01T10:00:05Z", "page": "/home", "user": "ana"}
{"ts": "2024-05-01T10:01:10Z", "page": "/pricing", "user": "ben"}
{"ts": "2024-05-01T10:03:30Z", "page": "/home", "user": "cai"}
{"ts": "2024-05-01T10:04:50Z", "page": "/home", "user": "ana"}
"#;

const VIEWS_2: &str = r#"{"ts": "2024-05-01T10:05:20Z", "page": "/pricing", "user": "ana"}
{"ts": "2024-05-01T10:06:40Z", "page": "/home", "user": "dev"}
{"ts": "soon", "page": "/docs", "user": "fay"}
{"ts": "2024-05-01T10:08:00Z", "page": "/docs", "user": "ben"}
"#;

const VIEWS_3: &str = r#"{"ts": "2024-05-01T10:11:00Z", "page": "/docs", "user": "cai"}
{"ts": "2024-05-01T10:12:30Z", "page": "/home", "user": "ben"}
{"ts": "2024-05-01T10:02:00Z", "page": "/home", "user": "eve"}
{"page": "/home", "user": 
{"ts": "2024-05-01T10:16:10Z", "page": "/pricing", "user": "dev"}
"#;

const STREAMING_README: &str = r#"# views_per_page: a streaming ETLantic query in two steps

Page views arrive as JSON-lines files in `data/views/`. The query counts views per page
in 5-minute event-time windows and writes each window to `out/views_per_page/` once the
watermark (the newest view's time minus a minute) has passed its end.

Step 1: two files are there.

    etlantic run          # windows closed so far: 10:00-10:05
    etlantic status       # stopped; watermark, state, quarantine, checkpoint

Step 2: a third file arrives.

    mv samples/step2/003.jsonl data/views/
    etlantic run          # goes on from the checkpoint: 10:05-10:10 and 10:10-10:15 close
    etlantic report -o report.html   # the query's history as charts

`out/quarantine.jsonl` holds what did not fit, with the reason and the file and line:
a time that is not a time (ETL702), a line that is not JSON (ETL701), and a view that came
after its window had closed (late, ETL708). The 10:15-10:20 window stays open until views
past 10:21 arrive.
"#;

/// Writes the batch example project into `dir` (created if needed). Refuses to overwrite
/// an existing `pipeline.yaml`.
pub fn init(dir: &Path) -> Result<Vec<PathBuf>> {
    init_template(dir, Template::Batch)
}

/// Writes the example project of `template` into `dir` (created if needed). Refuses to
/// overwrite an existing `pipeline.yaml`.
pub fn init_template(dir: &Path, template: Template) -> Result<Vec<PathBuf>> {
    if dir.join("pipeline.yaml").exists() {
        return Err(Error::new(
            &codes::IO_ERROR,
            format!(
                "{} already holds a pipeline.yaml; refusing to overwrite it",
                dir.display()
            ),
        ));
    }
    let mut written = Vec::new();
    for (rel, content) in template.files() {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::new(&codes::IO_ERROR, format!("{}: {e}", parent.display())))?;
        }
        std::fs::write(&path, content)
            .map_err(|e| Error::new(&codes::IO_ERROR, format!("{}: {e}", path.display())))?;
        written.push(path);
    }
    Ok(written)
}

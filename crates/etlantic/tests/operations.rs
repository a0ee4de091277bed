//! Operating a query: the application id, `etlantic status` on stopped, failed, killed
//! and running queries, and the Prometheus metrics a running query serves, scraped over
//! loopback.
//!
//! The pipeline is the click counts of the recovery tests: six files read one per
//! micro-batch; file 0 has a line that does not parse (ETL701), file 2 a bad timestamp,
//! file 3 a late click (quarantined, ETL708).

mod common;
use common::crash::*;
use common::{etlantic, etlantic_env, BIN};

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn profile(extra: &str) -> String {
    click_counts_profile(extra)
}

fn progress_records(dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(dir.join("chk/progress.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn metadata(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("chk/metadata")).unwrap()).unwrap()
}

fn status_json(dir: &Path) -> (i32, Value) {
    let run = etlantic(dir, &["status", "--format", "json"]);
    let code = run.code;
    (code, run.stdout_json())
}

#[test]
fn a_stopped_query_shows_its_ids_figures_and_why_it_stopped() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(dir, &profile("application_id: clicks-prod\n"));
    let run = etlantic(dir, &["run", "--format", "json"]);
    run.ok();
    let report = run.stdout_json();
    assert_eq!(report["application_id"], "clicks-prod");
    let query_id = metadata(dir)["id"].as_str().unwrap().to_string();
    assert_eq!(report["query_id"], query_id.as_str());
    assert_eq!(metadata(dir)["applicationId"], "clicks-prod");

    // Every progress record names the application, the query and the run.
    let records = progress_records(dir);
    assert!(records.len() >= 6, "{records:?}");
    for r in &records {
        assert_eq!(r["applicationId"], "clicks-prod");
        assert_eq!(r["id"], query_id.as_str());
        assert_eq!(r["runId"], report["run_id"]);
    }
    // One file per micro-batch: after the first, five files wait.
    assert_eq!(records[0]["sources"][0]["backlog"]["files"], 5);
    assert_eq!(records.last().unwrap()["sources"][0]["backlog"]["files"], 0);
    // Quarantined records by code: the unparsable line, the bad timestamp, the late click.
    let mut by_code = std::collections::BTreeMap::<String, u64>::new();
    for r in &records {
        for (code, n) in r["quarantinedByCode"].as_object().into_iter().flatten() {
            *by_code.entry(code.clone()).or_default() += n.as_u64().unwrap();
        }
    }
    assert_eq!(by_code.get("ETL708"), Some(&1), "{by_code:?}");
    assert_eq!(by_code.values().sum::<u64>(), 3, "{by_code:?}");

    let (code, s) = status_json(dir);
    assert_eq!(code, common::exit::OK, "{s}");
    assert_eq!(s["state"], "stopped");
    assert!(
        s["reason"].as_str().unwrap().contains("available-now"),
        "{s}"
    );
    assert_eq!(s["applicationId"], "clicks-prod");
    assert_eq!(s["queryId"], query_id.as_str());
    assert_eq!(s["runId"], report["run_id"]);
    assert_eq!(s["quarantinedRows"], 3);
    assert_eq!(s["lateRows"], 1);
    assert_eq!(s["batchesThisRun"], records.len() as u64);
    assert_eq!(s["sources"][0]["id"], "clicks");
    let read: u64 = records
        .iter()
        .map(|r| r["numInputRows"].as_u64().unwrap())
        .sum();
    // 13 lines, of which two do not decode (the late click is read, then quarantined).
    assert_eq!(read, 11);
    assert_eq!(s["sources"][0]["rowsThisRun"], read, "{s}");
    assert_eq!(s["sinks"][0]["id"], "write_counts");
    assert_eq!(s["sinks"][0]["rowsThisRun"], report["sinks"][0]["rows"]);
    assert!(s["checkpointBytes"].as_u64().unwrap() > 0);
    assert!(s["lastBatch"]["stateOperators"][0]["numRowsTotal"].is_u64());
    // The watermark of a stopped query is measured against its last micro-batch.
    assert!(s["watermarkLagMs"].as_i64().unwrap() >= 10_000, "{s}");

    // The same, for people; and the checkpoint can be named instead of the pipeline.
    let human = etlantic(dir, &["status", "chk"]);
    human.ok();
    for part in [
        "stopped",
        "clicks-prod",
        &query_id,
        "write_counts",
        "per_minute",
    ] {
        assert!(human.stdout.contains(part), "{part}:\n{}", human.stdout);
    }
}

#[test]
fn an_application_id_is_generated_once_and_kept_across_restarts() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(dir, &profile(""));
    etlantic(dir, &["run"]).ok();
    let first = metadata(dir)["applicationId"].as_str().unwrap().to_string();
    let runs_before = progress_records(dir).len();
    std::fs::write(dir.join("in/006.jsonl"), click("09:00", "c9", "u9") + "\n").unwrap();
    etlantic(dir, &["run"]).ok();
    assert_eq!(metadata(dir)["applicationId"], first.as_str());
    let records = progress_records(dir);
    assert!(records.len() > runs_before);
    let (a, b) = (&records[0], records.last().unwrap());
    assert_eq!(a["applicationId"], first.as_str());
    assert_eq!(b["applicationId"], first.as_str());
    assert_eq!(a["id"], b["id"]);
    assert_ne!(a["runId"], b["runId"]);
    // A profile's id takes over from then on, and the checkpoint keeps it.
    write_click_counts(dir, &profile("application_id: renamed\n"));
    etlantic(dir, &["run"]).ok();
    assert_eq!(metadata(dir)["applicationId"], "renamed");
    // A bad one is refused before anything runs.
    write_click_counts(dir, &profile("application_id: \"has spaces\"\n"));
    let bad = etlantic(dir, &["run"]);
    bad.expect_code(common::exit::INVALID_PIPELINE);
    assert!(bad.stderr.contains("ETL105"), "{}", bad.stderr);
}

#[test]
fn a_failed_run_and_a_killed_one_show_as_failed() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(dir, &profile("on_error: fail\n"));
    etlantic(dir, &["run"]).expect_code(common::exit::EXECUTION_FAILED);
    let (code, s) = status_json(dir);
    assert_eq!(code, common::exit::EXECUTION_FAILED, "{s}");
    assert_eq!(s["state"], "failed");
    assert!(s["reason"].as_str().unwrap().starts_with("ETL705"), "{s}");
    assert_eq!(s["run"]["errors"][0]["code"], "ETL705");

    // A process that dies leaves `running` behind; its process is gone.
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(dir, &profile(""));
    let killed = etlantic_env(dir, &["run"], &[("ETLANTIC_FAIL_POINT", "after_commit:1")]);
    assert_ne!(killed.code, common::exit::OK);
    let raw: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("chk/status.json")).unwrap())
            .unwrap();
    assert_eq!(raw["state"], "running");
    let (code, s) = status_json(dir);
    assert_eq!(code, common::exit::EXECUTION_FAILED, "{s}");
    assert_eq!(s["state"], "failed");
    assert!(
        s["reason"]
            .as_str()
            .unwrap()
            .contains("without recording why"),
        "{s}"
    );
    // No checkpoint there: a diagnostic, not a panic.
    let none = etlantic(dir, &["status", "no-such-checkpoint"]);
    assert_ne!(none.code, common::exit::OK);
    assert!(none.stderr.contains("ETL714"), "{}", none.stderr);
}

/// `GET path` over loopback: (status line and headers, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// The value of the series `name` whose labels include every one of `labels`.
fn sample(body: &str, name: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.split(['{', ' ']).next() == Some(name) && labels.iter().all(|x| l.contains(x)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// A query process that a failed assertion must not leave running.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_running_query_serves_prometheus_metrics_and_shows_as_running() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(
        dir,
        &profile("application_id: clicks-live\n").replace(
            "trigger: available_now",
            "trigger: processing_time 100 milliseconds",
        ),
    );
    let mut child = KillOnDrop(
        Command::new(BIN)
            .args(["run", "--metrics-addr", "127.0.0.1:0"])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let child = &mut child.0;
    // The address the server bound (port 0: any free one).
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut addr = None;
    let mut line = String::new();
    while addr.is_none() && stderr.read_line(&mut line).unwrap() > 0 {
        if let Some(rest) = line.trim().strip_prefix("serving metrics at http://") {
            addr = Some(rest.trim_end_matches("/metrics").to_string());
        }
        line.clear();
    }
    let addr = addr.expect("the run names its metrics address");
    // Keep draining stderr so the child never blocks on it.
    let drain = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = stderr.read_to_string(&mut rest);
        rest
    });

    // Six files, one per micro-batch: wait until all are read.
    let deadline = Instant::now() + Duration::from_secs(120);
    let body = loop {
        let (head, body) = http_get(&addr, "/metrics");
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        let backlog = sample(
            &body,
            "etlantic_source_backlog_files",
            &["source=\"clicks\""],
        );
        if backlog == Some(0.0) && sample(&body, "etlantic_late_rows_total", &[]) == Some(1.0) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the query did not read its files:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let q = "application=\"clicks-live\"";
    let rows_read = sample(
        &body,
        "etlantic_input_rows_total",
        &[q, "source=\"clicks\""],
    );
    assert_eq!(rows_read, Some(11.0), "{body}");
    assert_eq!(
        sample(
            &body,
            "etlantic_quarantined_rows_total",
            &[q, "code=\"ETL708\""]
        ),
        Some(1.0),
        "{body}"
    );
    assert!(sample(&body, "etlantic_batches_total", &[q]).unwrap() >= 6.0);
    assert!(sample(&body, "etlantic_batch_duration_seconds_count", &[q]).unwrap() >= 6.0);
    assert!(sample(&body, "etlantic_state_rows", &[q, "operator=\"per_minute."]).is_some());
    assert!(
        sample(
            &body,
            "etlantic_sink_commits_total",
            &[q, "sink=\"write_counts\""]
        )
        .unwrap()
            >= 6.0
    );
    assert!(sample(&body, "etlantic_watermark_seconds", &[q]).unwrap() > 1.7e9);
    assert!(
        sample(
            &body,
            "etlantic_run_info",
            &[q, "pipeline=\"click_counts\""]
        ) == Some(1.0)
    );
    let (head, _) = http_get(&addr, "/nothing");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");

    // `status` sees it running, with its metrics address.
    let (code, s) = status_json(dir);
    assert_eq!(code, common::exit::OK, "{s}");
    assert_eq!(s["state"], "running", "{s}");
    assert_eq!(s["run"]["metricsAddr"], addr.as_str());
    assert_eq!(s["run"]["pid"], child.id());

    // Ctrl-C stops it after the current micro-batch, and it says so.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let exit = child.wait().unwrap();
    let rest = drain.join().unwrap();
    assert!(exit.success(), "{exit:?}\n{rest}");
    let (_, s) = status_json(dir);
    assert_eq!(s["state"], "stopped", "{s}");
    assert_eq!(s["reason"], "stopped on request");
    // The server went with the run.
    assert!(std::net::TcpStream::connect(&addr).is_err());
}

/// Headless Chromium (Debian's `chromium`; `cargo xtask setup` and `ci` install it).
fn chromium() -> std::path::PathBuf {
    let path = std::env::var_os("CHROMIUM")
        .map(Into::into)
        .unwrap_or_else(|| std::path::PathBuf::from("/usr/bin/chromium"));
    assert!(
        path.exists(),
        "headless Chromium is needed to check the report page: `cargo xtask setup` installs it (apt-get install chromium), or set CHROMIUM"
    );
    path
}

#[test]
fn the_report_page_renders_its_charts_in_a_browser() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(dir, &profile("application_id: clicks-report\n"));
    etlantic(dir, &["run"]).ok();
    let made = etlantic(dir, &["report", "-o", "report.html"]);
    made.ok();
    assert!(made.stdout.contains("micro-batches"), "{}", made.stdout);
    let page = std::fs::read_to_string(dir.join("report.html")).unwrap();
    assert_eq!(page.matches("<svg class=\"chart\"").count(), 6);
    assert!(page.contains("clicks-report"));
    // Self-contained: nothing fetched from anywhere.
    assert!(!page.contains("src=") && !page.contains("<link") && !page.contains("<script"));

    // The browser lays the charts out: measure every line of every chart after load and
    // write the figures into the page, which `--dump-dom` prints.
    let probe = page.replace(
        "</body>",
        r#"<script>
const out = [...document.querySelectorAll('svg.chart')].map(svg => {
  const box = svg.getBoundingClientRect();
  const lines = [...svg.querySelectorAll('polyline.series')].map(l => {
    const b = l.getBBox();
    return {name: l.dataset.series, points: l.points.numberOfItems, w: b.width, h: b.height};
  });
  return {label: svg.getAttribute('aria-label'), w: box.width, h: box.height, lines};
});
const pre = document.createElement('pre');
pre.id = 'render-check';
pre.textContent = JSON.stringify(out);
document.body.appendChild(pre);
</script></body>"#,
    );
    std::fs::write(dir.join("probe.html"), probe).unwrap();
    let out = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--dump-dom",
        ])
        .arg(format!("file://{}", dir.join("probe.html").display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let start = dom.find("<pre id=\"render-check\">").unwrap_or_else(|| {
        panic!(
            "no render check in the DOM:\n{dom}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    let json = &dom[start + "<pre id=\"render-check\">".len()..];
    let json = &json[..json.find("</pre>").unwrap()];
    let charts: Vec<Value> = serde_json::from_str(&json.replace("&quot;", "\"")).unwrap();
    assert_eq!(charts.len(), 6, "{charts:?}");
    for c in &charts {
        assert!(
            c["w"].as_f64().unwrap() >= 700.0 && c["h"].as_f64().unwrap() >= 200.0,
            "{c}"
        );
    }
    let chart = |label: &str| {
        charts
            .iter()
            .find(|c| c["label"].as_str().unwrap().starts_with(label))
            .unwrap_or_else(|| panic!("no chart {label}: {charts:?}"))
    };
    let records = progress_records(dir).len() as u64;
    // Every micro-batch is a point of the rate and duration lines, drawn with some extent.
    for label in [
        "Input and processing rates",
        "Micro-batch duration",
        "State size",
    ] {
        for line in chart(label)["lines"].as_array().unwrap() {
            assert_eq!(line["points"], records, "{label}: {line}");
            assert!(line["w"].as_f64().unwrap() > 100.0, "{label}: {line}");
        }
    }
    // The late click and the two bad lines rise above the axis.
    let late = chart("Late and quarantined")["lines"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        late.iter().all(|l| l["h"].as_f64().unwrap() > 10.0),
        "{late:?}"
    );
}

#[test]
fn a_batch_run_shows_its_reads_as_a_bar_on_a_terminal_and_as_lines_otherwise() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(dir, &as_batch(&profile("")));
    let bytes: u64 = input_files().iter().map(|(_, t)| t.len() as u64).sum();

    // A terminal: one line redrawn in place, ending with every file read.
    let run = etlantic_env(dir, &["run"], &[("ETLANTIC_PROGRESS", "bar")]);
    run.ok();
    let last = run.stderr.rsplit("\r\x1b[2K").next().unwrap();
    assert!(
        last.starts_with("reading [========================] 6/6 files"),
        "{:?}",
        run.stderr
    );
    let size = etlantic::status::bytes(bytes);
    assert!(last.contains(&format!("{size}/{size}")), "{last:?}");
    // 13 lines; 11 decode (the unparsable line and the bad timestamp do not).
    assert!(last.contains("  11 rows  "), "{last:?}");
    assert!(last.ends_with('\n'), "the bar ends its line: {last:?}");

    // Not a terminal (what the tests' pipes are): plain lines, no redrawing.
    let run = etlantic(dir, &["run"]);
    run.ok();
    assert!(!run.stderr.contains('\r'), "{:?}", run.stderr);
    let line = run
        .stderr
        .lines()
        .rfind(|l| l.starts_with("reading: "))
        .unwrap_or_else(|| panic!("{}", run.stderr));
    assert!(line.starts_with("reading: 6/6 files"), "{line}");

    // Off, or JSON output: nothing.
    let run = etlantic_env(dir, &["run"], &[("ETLANTIC_PROGRESS", "off")]);
    assert!(!run.stderr.contains("reading"), "{}", run.stderr);
    let run = etlantic(dir, &["run", "--format", "json"]);
    assert!(!run.stderr.contains("reading"), "{}", run.stderr);
}

#[test]
fn an_available_now_backfill_shows_files_done_of_the_backlog() {
    let p = common::Project::empty();
    let dir = p.dir.path();
    write_click_counts(dir, &profile(""));
    let run = etlantic_env(dir, &["run"], &[("ETLANTIC_PROGRESS", "bar")]);
    run.ok();
    let records = progress_records(dir);
    // Each micro-batch's line is printed above the bar, which is redrawn after it: after
    // the first micro-batch (one file per micro-batch), 1 of 6 files.
    let after_first = run
        .stderr
        .split("\r\x1b[2K")
        .find(|s| s.starts_with("backfill [") && s.contains("  1 batch  "))
        .unwrap_or_else(|| panic!("{:?}", run.stderr));
    assert!(after_first.contains(" 1/6 files"), "{after_first:?}");
    let last = run.stderr.rsplit("\r\x1b[2K").next().unwrap();
    assert!(
        last.starts_with("backfill [========================] 6/6 files"),
        "{last:?}"
    );
    assert!(
        last.contains(&format!("  {} batches  ", records.len())),
        "{last:?}"
    );
    for r in &records {
        let line = format!("batch {:>5} ", r["batchId"].as_u64().unwrap());
        assert!(run.stderr.contains(&line), "{line}\n{}", run.stderr);
    }
}

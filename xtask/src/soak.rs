//! `cargo xtask soak`: a long run of a streaming query that must not grow.
//!
//! The query (`xtask/soak/pipeline.yaml`) reads Nexmark bids and auctions from the
//! generator, paced by the wall clock at a fixed rate, through a tumbling-window count, a
//! deduplication within the watermark and a time-bounded stream-stream join, on a
//! processing-time trigger of one second. Every `--interval` seconds the command samples
//! the process's resident memory and open file descriptors, the state rows of its last
//! progress record, the checkpoint's size and file count (without the progress log, which
//! rotates at its own bound), and how far its watermark
//! trails the wall clock. It fails when any of them grows over the second half of the run
//! (a least-squares slope over that half projecting more than its tolerance, and a median
//! over that half above the first half's by more than it: see [`judge`]), or when the
//! query falls behind; it writes the samples as CSV and an SVG plot.

use anyhow::{bail, Context, Result};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const PIPELINE: &str = include_str!("../soak/pipeline.yaml");

/// What a soak run measures.
pub struct Options {
    /// Length of the run.
    pub minutes: f64,
    /// Generator events per second (all three Nexmark kinds).
    pub rate: u64,
    /// Seconds between samples.
    pub interval: u64,
    /// Where the project, the samples and the plot go.
    pub out: PathBuf,
    /// The `etlantic` binary.
    pub binary: PathBuf,
}

/// One sample.
#[derive(Clone, Debug, Default)]
struct Sample {
    secs: f64,
    rss_mb: f64,
    open_files: f64,
    state_rows: f64,
    checkpoint_mb: f64,
    checkpoint_files: f64,
    watermark_lag_s: f64,
    input_rows: f64,
}

/// A measured series: its column name, how it is read from a sample, and how much it may
/// grow over the second half (relative to its median there, or absolute).
struct Metric {
    name: &'static str,
    unit: &'static str,
    get: fn(&Sample) -> f64,
    relative: f64,
    absolute: f64,
}

const METRICS: &[Metric] = &[
    Metric {
        name: "rss_mb",
        unit: "MB",
        get: |s| s.rss_mb,
        relative: 0.05,
        absolute: 4.0,
    },
    Metric {
        name: "open_files",
        unit: "",
        get: |s| s.open_files,
        relative: 0.0,
        absolute: 2.0,
    },
    Metric {
        name: "state_rows",
        unit: "rows",
        get: |s| s.state_rows,
        relative: 0.05,
        absolute: 100.0,
    },
    Metric {
        name: "checkpoint_mb",
        unit: "MB",
        get: |s| s.checkpoint_mb,
        relative: 0.10,
        absolute: 1.0,
    },
    Metric {
        name: "checkpoint_files",
        unit: "",
        get: |s| s.checkpoint_files,
        relative: 0.0,
        absolute: 4.0,
    },
    Metric {
        name: "watermark_lag_s",
        unit: "s",
        get: |s| s.watermark_lag_s,
        relative: 0.0,
        absolute: 2.0,
    },
];

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Runs the soak; returns an error when something grew or the query failed.
pub fn run(o: &Options) -> Result<()> {
    if o.out.exists() {
        std::fs::remove_dir_all(&o.out)?;
    }
    std::fs::create_dir_all(&o.out)?;
    let project = o.out.join("project");
    std::fs::create_dir_all(&project)?;
    std::fs::write(project.join("pipeline.yaml"), PIPELINE)?;
    let gap_us = (1_000_000 / o.rate.max(1)).max(1);
    let source = format!(
        "realtime=true&event_gap_us={gap_us}&start_ms={}&events_per_batch=1000000000",
        now_ms()
    );
    std::fs::write(
        project.join("profile.yaml"),
        format!(
            "apiVersion: etlantic/v1\nkind: Profile\nname: soak\nmode: streaming\ntrigger: processing_time 1 second\ncheckpoint: file://chk\nbindings:\n  bids: nexmark://bids?{source}\n  auctions: nexmark://auctions?{source}\n  window_counts: file://out/window_counts/?format=jsonl\n  first_bids: file://out/first_bids/?format=jsonl\n  matched: file://out/matched/?format=jsonl\nquarantine: file://out/quarantine.jsonl\n"
        ),
    )?;
    let stderr = std::fs::File::create(o.out.join("run.stderr"))?;
    let stdout = std::fs::File::create(o.out.join("run.stdout"))?;
    let mut child = Command::new(&o.binary)
        .current_dir(&project)
        .args([
            "run",
            "pipeline.yaml",
            "--profile",
            "profile.yaml",
            "--format",
            "json",
        ])
        .stdout(stdout)
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("cannot start {}", o.binary.display()))?;
    let started = Instant::now();
    let total = Duration::from_secs_f64(o.minutes * 60.0);
    let mut samples = Vec::new();
    let result = (|| -> Result<()> {
        while started.elapsed() < total {
            std::thread::sleep(Duration::from_secs(o.interval).min(total - started.elapsed()));
            if let Some(status) = child.try_wait()? {
                bail!("the query stopped after {:?}: {status}", started.elapsed());
            }
            let s = sample(
                &child,
                &project.join("chk"),
                started.elapsed().as_secs_f64(),
            )?;
            eprintln!(
                "{:>6.0} s  rss {:>7.1} MB  fds {:>3}  state {:>8} rows  checkpoint {:>6.2} MB in {:>3} files  watermark lag {:>5.1} s",
                s.secs, s.rss_mb, s.open_files, s.state_rows, s.checkpoint_mb, s.checkpoint_files, s.watermark_lag_s
            );
            samples.push(s);
        }
        Ok(())
    })();
    stop(&mut child)?;
    result?;
    write_csv(&o.out.join("samples.csv"), &samples)?;
    std::fs::write(o.out.join("soak.svg"), svg(&samples))?;
    let verdicts = judge(&samples);
    let mut report = format!(
        "soak: {:.1} minutes at {} events/s, a sample every {} s ({} samples)\n\n| metric | first half median | second half median | second half trend | limit | |\n|---|---|---|---|---|---|\n",
        o.minutes,
        o.rate,
        o.interval,
        samples.len()
    );
    for v in &verdicts {
        report.push_str(&v.row());
    }
    std::fs::write(o.out.join("summary.md"), &report)?;
    println!("{report}");
    println!(
        "samples: {}\nplot: {}",
        o.out.join("samples.csv").display(),
        o.out.join("soak.svg").display()
    );
    let grew: Vec<&str> = verdicts.iter().filter(|v| !v.ok).map(|v| v.name).collect();
    if o.minutes < 5.0 {
        println!("(a run shorter than 5 minutes is a smoke run: growth is reported, not judged)");
        return Ok(());
    }
    if !grew.is_empty() {
        bail!("grew over the second half of the run: {}", grew.join(", "));
    }
    Ok(())
}

/// Stops the query as Ctrl-C does and waits for it; it must exit cleanly.
fn stop(child: &mut Child) -> Result<()> {
    if child.try_wait()?.is_some() {
        return Ok(());
    }
    Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            if !status.success() {
                bail!("the query did not stop cleanly: {status}");
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            bail!("the query did not stop within a minute of Ctrl-C");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn sample(child: &Child, checkpoint: &Path, secs: f64) -> Result<Sample> {
    let pid = child.id();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let open_files = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count() as f64;
    let (bytes, files) = dir_size(checkpoint);
    let mut s = Sample {
        secs,
        rss_mb: rss_kb / 1024.0,
        open_files,
        checkpoint_mb: bytes as f64 / 1e6,
        checkpoint_files: files as f64,
        ..Sample::default()
    };
    if let Some(p) = last_progress(&checkpoint.join("progress.jsonl")) {
        s.state_rows = p["stateOperators"]
            .as_array()
            .map(|ops| ops.iter().filter_map(|o| o["numRowsTotal"].as_f64()).sum())
            .unwrap_or(0.0);
        s.input_rows = p["numInputRows"].as_f64().unwrap_or(0.0);
        if let Some(w) = p["eventTime"]["watermark"].as_str() {
            if let Some(ms) = parse_rfc3339_ms(w) {
                s.watermark_lag_s = (now_ms() - ms) as f64 / 1000.0;
            }
        }
    }
    Ok(s)
}

/// Milliseconds of an ISO-8601 UTC time `YYYY-MM-DDTHH:MM:SS.sssZ`.
fn parse_rfc3339_ms(t: &str) -> Option<i64> {
    let (date, time) = t.trim_end_matches('Z').split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut h = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (h.next()?.ok()?, h.next()?.ok()?, h.next()?.ok()?);
    let ms: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    // Days since the epoch (civil calendar).
    let (y2, m2) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let doy = (153 * m2 + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms)
}

fn last_progress(path: &Path) -> Option<serde_json::Value> {
    let file = std::fs::File::open(path).ok()?;
    let mut last = None;
    for line in std::io::BufReader::new(file).lines().map_while(|l| l.ok()) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            last = Some(v);
        }
    }
    last
}

/// The bytes and files under `dir`, without the progress log: it is an operator's log,
/// not recovery state, and grows to its own bound (rotation at 8 MiB, tested on its own)
/// over about an hour at one record a second — a trend a 30-minute run would flag.
fn dir_size(dir: &Path) -> (u64, u64) {
    let mut bytes = 0;
    let mut files = 0;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_name()
                .to_string_lossy()
                .starts_with("progress.jsonl")
            {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_dir() {
                let (b, f) = dir_size(&e.path());
                bytes += b;
                files += f;
            } else {
                bytes += meta.len();
                files += 1;
            }
        }
    }
    (bytes, files)
}

fn write_csv(path: &Path, samples: &[Sample]) -> Result<()> {
    let mut f = std::fs::File::create(path)?;
    writeln!(
        f,
        "seconds,rss_mb,open_files,state_rows,checkpoint_mb,checkpoint_files,watermark_lag_s,input_rows"
    )?;
    for s in samples {
        writeln!(
            f,
            "{:.1},{:.2},{},{},{:.3},{},{:.2},{}",
            s.secs,
            s.rss_mb,
            s.open_files,
            s.state_rows,
            s.checkpoint_mb,
            s.checkpoint_files,
            s.watermark_lag_s,
            s.input_rows
        )?;
    }
    Ok(())
}

struct Verdict {
    name: &'static str,
    unit: &'static str,
    first: f64,
    second: f64,
    trend: f64,
    limit: f64,
    ok: bool,
}

impl Verdict {
    fn row(&self) -> String {
        format!(
            "| {} | {:.2} {u} | {:.2} {u} | {:+.2} {u} | {:.2} {u} | {} |\n",
            self.name,
            self.first,
            self.second,
            self.trend,
            self.limit,
            if self.ok { "ok" } else { "GREW" },
            u = self.unit
        )
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// For each metric: the least-squares slope over the second half of the samples, times
/// that half's length (the trend), and how far the second half's median is above the
/// first half's, each against the metric's tolerance. It grew when both are over: a leak
/// raises both; a plateau after warm-up raises only the medians' difference; a slow
/// oscillation (state that fills and drains with the generator's cycles) can give the
/// second half a rising trend, but not a higher median.
fn judge(samples: &[Sample]) -> Vec<Verdict> {
    let half = samples.len() / 2;
    let (first, second) = samples.split_at(half);
    METRICS
        .iter()
        .map(|m| {
            let xs: Vec<f64> = second.iter().map(|s| s.secs).collect();
            let ys: Vec<f64> = second.iter().map(m.get).collect();
            let n = xs.len() as f64;
            let trend = if xs.len() >= 2 {
                let mx = xs.iter().sum::<f64>() / n;
                let my = ys.iter().sum::<f64>() / n;
                let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
                let sxy: f64 = xs.iter().zip(&ys).map(|(x, y)| (x - mx) * (y - my)).sum();
                let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
                slope * (xs[xs.len() - 1] - xs[0])
            } else {
                0.0
            };
            let second_median = median(ys);
            let first_median = median(first.iter().map(m.get).collect());
            let limit = m.absolute.max(m.relative * second_median);
            Verdict {
                name: m.name,
                unit: m.unit,
                first: first_median,
                second: second_median,
                trend,
                limit,
                ok: trend <= limit || second_median - first_median <= limit,
            }
        })
        .collect()
}

/// The samples as small line charts, one per metric, stacked.
fn svg(samples: &[Sample]) -> String {
    let (w, h, pad) = (720.0, 130.0, 40.0);
    let total_h = h * METRICS.len() as f64 + 20.0;
    let t_max = samples.last().map(|s| s.secs).unwrap_or(1.0).max(1.0);
    let mut out = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{total_h}\" font-family=\"sans-serif\" font-size=\"11\">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    for (i, m) in METRICS.iter().enumerate() {
        let top = 10.0 + h * i as f64;
        let values: Vec<f64> = samples.iter().map(m.get).collect();
        let max = values.iter().cloned().fold(0.0f64, f64::max).max(1e-9) * 1.1;
        let x = |t: f64| pad + (w - 2.0 * pad) * t / t_max;
        let y = |v: f64| top + (h - 30.0) * (1.0 - v / max);
        out.push_str(&format!(
            "<text x=\"{pad}\" y=\"{}\">{} ({}; max {:.1})</text>\n<line x1=\"{pad}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#999\"/>\n<line x1=\"{}\" y1=\"{top}\" x2=\"{}\" y2=\"{}\" stroke=\"#ccc\" stroke-dasharray=\"4\"/>\n",
            top + 10.0,
            m.name,
            if m.unit.is_empty() { "count" } else { m.unit },
            max / 1.1,
            y(0.0),
            w - pad,
            y(0.0),
            x(t_max / 2.0),
            x(t_max / 2.0),
            y(0.0),
        ));
        let points: Vec<String> = samples
            .iter()
            .zip(&values)
            .map(|(s, v)| format!("{:.1},{:.1}", x(s.secs), y(*v)))
            .collect();
        out.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"{}\"/>\n",
            points.join(" ")
        ));
    }
    out.push_str(&format!(
        "<text x=\"{}\" y=\"{}\">seconds (0 to {:.0}); dashed: start of the second half</text>\n</svg>\n",
        pad,
        total_h - 4.0,
        t_max
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso_times_and_trends() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:01.500Z"), Some(1500));
        assert_eq!(
            parse_rfc3339_ms("2024-01-02T03:04:05.000Z"),
            Some(1_704_164_645_000)
        );
        let flat: Vec<Sample> = (0..20)
            .map(|i| Sample {
                secs: i as f64 * 10.0,
                rss_mb: 100.0 + (i % 3) as f64,
                ..Sample::default()
            })
            .collect();
        assert!(judge(&flat).iter().all(|v| v.ok));
        let growing: Vec<Sample> = (0..20)
            .map(|i| Sample {
                secs: i as f64 * 10.0,
                rss_mb: 100.0 + 3.0 * i as f64,
                ..Sample::default()
            })
            .collect();
        let v = judge(&growing);
        assert!(!v.iter().find(|v| v.name == "rss_mb").unwrap().ok);
        assert!(svg(&growing).starts_with("<svg"));

        // State that fills and drains over a 13-minute cycle (the 30-minute run's state
        // rows): the second half ends on a rise, but does not sit higher.
        let cycling: Vec<Sample> = (0..180)
            .map(|i| {
                let t = i as f64 * 10.0;
                let phase = (t % 780.0) / 780.0;
                Sample {
                    secs: t,
                    state_rows: 10_500.0 + 1_200.0 * phase,
                    ..Sample::default()
                }
            })
            .collect();
        let v = judge(&cycling);
        let rows = v.iter().find(|v| v.name == "state_rows").unwrap();
        assert!(rows.ok, "a cycle is not growth: {}", rows.row());
        // A plateau after warm-up is not growth either.
        let warming: Vec<Sample> = (0..40)
            .map(|i| Sample {
                secs: i as f64 * 10.0,
                state_rows: (i as f64 * 1_000.0).min(10_000.0),
                ..Sample::default()
            })
            .collect();
        assert!(judge(&warming).iter().all(|v| v.ok));
    }
}

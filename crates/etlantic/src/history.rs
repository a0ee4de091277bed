//! `etlantic report`: a query's history, from its progress records, as one
//! self-contained HTML page with SVG charts — rates, micro-batch duration, watermark lag,
//! state size, late and quarantined rows over time. No script or style is fetched: the
//! page opens from a file, offline, in any browser.

use etlantic_runtime::progress::QueryProgress;
use etlantic_runtime::status::QueryStatus;
use std::fmt::Write;

/// One line of a chart: its name, colour and points `(x, y)` (x: Unix milliseconds).
pub struct Series {
    /// The legend's name.
    pub name: String,
    /// A CSS colour.
    pub color: &'static str,
    /// The points, in x order.
    pub points: Vec<(f64, f64)>,
}

/// A chart: its title, the unit of its y axis, its lines.
pub struct Chart {
    /// Shown above the chart.
    pub title: String,
    /// The y axis' unit (`rows/s`, `ms`, ...).
    pub unit: &'static str,
    /// The lines.
    pub series: Vec<Series>,
}

const WIDTH: f64 = 760.0;
const HEIGHT: f64 = 260.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 20.0;
const BOTTOM: f64 = 40.0;

/// "Nice" tick values covering `[lo, hi]`: about five steps of 1, 2 or 5 × 10ⁿ.
fn ticks(lo: f64, hi: f64) -> Vec<f64> {
    let span = (hi - lo).max(f64::EPSILON);
    let raw = span / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).ceil() * step;
    (0..=12)
        .map(|i| first + i as f64 * step)
        .take_while(|v| *v <= hi + step * 1e-9)
        .collect()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A y value for people: `1.2M`, `35k`, `0.25`.
fn short(v: f64) -> String {
    let a = v.abs();
    if a >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if a >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if a >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else if a >= 100.0 || v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

/// A time of day (UTC) for the x axis, to the millisecond when `precise`.
fn clock(ms: f64, precise: bool) -> String {
    let format = if precise { "%H:%M:%S%.3f" } else { "%H:%M:%S" };
    chrono::DateTime::<chrono::Utc>::from_timestamp_millis(ms as i64)
        .map(|t| t.format(format).to_string())
        .unwrap_or_default()
}

impl Chart {
    /// The chart as an `<svg>` element: axes with ticks, one polyline (and a dot per
    /// point) per series, a legend. A chart with no points says so.
    pub fn svg(&self) -> String {
        let points = self.series.iter().flat_map(|s| &s.points);
        let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
        let mut any = false;
        for (x, y) in points {
            any = true;
            x0 = x0.min(*x);
            x1 = x1.max(*x);
            y1 = y1.max(*y);
        }
        let mut out = String::new();
        let _ = write!(
            out,
            r#"<svg class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" aria-label="{}">"#,
            escape(&self.title)
        );
        let (pw, ph) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
        let _ = write!(
            out,
            r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#ccc"/>"##
        );
        if !any {
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" text-anchor="middle" class="empty">no data</text></svg>"#,
                LEFT + pw / 2.0,
                TOP + ph / 2.0
            );
            return out;
        }
        if x1 <= x0 {
            x1 = x0 + 1000.0;
        }
        let mut yt = ticks(0.0, if y1 > 0.0 { y1 } else { 1.0 });
        // The top of the chart is a tick: one step above the highest value if need be.
        if let (Some(&last), Some(&step)) = (yt.last(), yt.get(1)) {
            if last < y1 {
                yt.push(last + step);
            }
        }
        let ymax = yt.last().copied().unwrap_or(1.0).max(y1).max(f64::EPSILON);
        let sx = |x: f64| LEFT + (x - x0) / (x1 - x0) * pw;
        let sy = |y: f64| TOP + ph - y / ymax * ph;
        for v in &yt {
            let y = sy(*v);
            let _ = write!(
                out,
                r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e4e4e4"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                short(*v)
            );
        }
        // Under a minute, the times differ in their seconds' fractions.
        let precise = x1 - x0 < 60_000.0;
        for v in ticks(x0, x1) {
            let x = sx(v);
            let _ = write!(
                out,
                r#"<text x="{x:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
                TOP + ph + 16.0,
                clock(v, precise)
            );
        }
        let _ = write!(
            out,
            r#"<text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle" class="unit">{}</text>"#,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            escape(self.unit)
        );
        for (i, s) in self.series.iter().enumerate() {
            let path: Vec<String> = s
                .points
                .iter()
                .map(|(x, y)| format!("{:.1},{:.1}", sx(*x), sy(*y)))
                .collect();
            let _ = write!(
                out,
                r#"<polyline class="series" data-series="{}" fill="none" stroke="{}" stroke-width="1.8" points="{}"/>"#,
                escape(&s.name),
                s.color,
                path.join(" ")
            );
            // Dots, so a single micro-batch shows too; each names its value.
            for (x, y) in &s.points {
                let _ = write!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.2" fill="{}"><title>{} {}: {}</title></circle>"#,
                    sx(*x),
                    sy(*y),
                    s.color,
                    clock(*x, true),
                    escape(&s.name),
                    short(*y)
                );
            }
            let lx = LEFT + 10.0 + i as f64 * 170.0;
            let _ = write!(
                out,
                r#"<rect x="{lx}" y="{}" width="12" height="4" fill="{}"/><text x="{}" y="{}" class="legend">{}</text>"#,
                HEIGHT - 10.0,
                s.color,
                lx + 16.0,
                HEIGHT - 5.0,
                escape(&s.name)
            );
        }
        out.push_str("</svg>");
        out
    }
}

fn ms(iso: &str) -> Option<f64> {
    chrono::DateTime::parse_from_rfc3339(iso)
        .ok()
        .map(|d| d.timestamp_millis() as f64)
}

/// The charts of a query's progress records (oldest first).
pub fn charts(records: &[QueryProgress]) -> Vec<Chart> {
    let at = |p: &QueryProgress| ms(&p.timestamp);
    let line =
        |name: &str, color: &'static str, f: &dyn Fn(&QueryProgress) -> Option<f64>| Series {
            name: name.to_string(),
            color,
            points: records
                .iter()
                .filter_map(|p| Some((at(p)?, f(p)?)))
                .collect(),
        };
    vec![
        Chart {
            title: "Input and processing rates".into(),
            unit: "rows/s",
            series: vec![
                line("input rows/s", "#1f77b4", &|p| {
                    Some(p.input_rows_per_second)
                }),
                line("processed rows/s", "#ff7f0e", &|p| {
                    Some(p.processed_rows_per_second)
                }),
            ],
        },
        Chart {
            title: "Micro-batch duration".into(),
            unit: "ms",
            series: vec![line("duration", "#2ca02c", &|p| {
                Some(p.batch_duration as f64)
            })],
        },
        Chart {
            title: "Watermark lag behind the micro-batch".into(),
            unit: "s",
            series: vec![line("lag", "#d62728", &|p| {
                let wm = ms(p.event_time.watermark.as_deref()?)?;
                let t = at(p)?;
                (wm > 0.0).then(|| (t - wm) / 1000.0)
            })],
        },
        Chart {
            title: "State size".into(),
            unit: "rows",
            series: vec![line("rows in state", "#9467bd", &|p| {
                (!p.state_operators.is_empty()).then(|| {
                    p.state_operators
                        .iter()
                        .map(|o| o.num_rows_total)
                        .sum::<u64>() as f64
                })
            })],
        },
        Chart {
            title: "State bytes".into(),
            unit: "bytes",
            series: vec![line("bytes in state", "#8c564b", &|p| {
                (!p.state_operators.is_empty()).then(|| {
                    p.state_operators
                        .iter()
                        .map(|o| o.memory_used_bytes)
                        .sum::<u64>() as f64
                })
            })],
        },
        Chart {
            title: "Late and quarantined rows per micro-batch".into(),
            unit: "rows",
            series: vec![
                line("late", "#e377c2", &|p| Some(p.late_rows as f64)),
                line("quarantined", "#7f7f7f", &|p| {
                    Some(p.quarantined_rows as f64)
                }),
            ],
        },
    ]
}

/// The whole page: a summary of the query's status, then the charts.
pub fn page(status: &QueryStatus, records: &[QueryProgress]) -> String {
    let mut out = String::new();
    let title = format!("ETLantic query {}", status.pipeline);
    let _ = write!(
        out,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em; color: #222; }}
h1 {{ font-size: 1.4em; }} h2 {{ font-size: 1.05em; margin: 1.6em 0 0.3em; }}
table {{ border-collapse: collapse; }} td {{ padding: 2px 12px 2px 0; vertical-align: top; }}
.chart text {{ font-size: 11px; fill: #555; }} .chart .legend {{ fill: #222; }}
pre {{ background: #f4f4f4; padding: 1em; overflow-x: auto; }}
</style></head><body>
<h1>{}</h1>
"#,
        escape(&title),
        escape(&title)
    );
    let state = serde_json::to_value(status.state)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default();
    let rows = [
        ("state", state),
        ("why", status.reason.clone().unwrap_or_default()),
        ("application", status.ids.application_id.clone()),
        ("query id", status.ids.query_id.clone()),
        ("last run id", status.ids.run_id.clone()),
        (
            "checkpoint",
            format!(
                "{} ({})",
                status.checkpoint,
                crate::status::bytes(status.checkpoint_bytes)
            ),
        ),
        ("micro-batches shown", records.len().to_string()),
        (
            "from",
            records
                .first()
                .map(|p| p.timestamp.clone())
                .unwrap_or_default(),
        ),
        (
            "to",
            records
                .last()
                .map(|p| p.timestamp.clone())
                .unwrap_or_default(),
        ),
    ];
    out.push_str("<table>\n");
    for (k, v) in rows.iter().filter(|(_, v)| !v.is_empty()) {
        let _ = writeln!(out, "<tr><td>{k}</td><td>{}</td></tr>", escape(v));
    }
    out.push_str("</table>\n");
    for chart in charts(records) {
        let _ = writeln!(out, "<h2>{}</h2>\n{}", escape(&chart.title), chart.svg());
    }
    out.push_str(
        "<p>From the query's progress records (<code>progress.jsonl</code>, the newest \
         8 MiB or so; older ones are rotated away). Times are UTC.</p>\n</body></html>\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(ticks(0.0, 10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        let small = ticks(0.0, 0.9);
        assert_eq!(small.len(), 5);
        assert!((small[4] - 0.8).abs() < 1e-9, "{small:?}");
        let t = ticks(0.0, 1234.0);
        assert_eq!(t.first(), Some(&0.0));
        assert!(t.len() >= 3 && t.len() <= 7, "{t:?}");
    }

    #[test]
    fn a_chart_draws_every_point_and_an_empty_one_says_so() {
        let chart = Chart {
            title: "t <&>".into(),
            unit: "ms",
            series: vec![Series {
                name: "a".into(),
                color: "red",
                points: vec![(0.0, 1.0), (1000.0, 3.0), (2000.0, 2.0)],
            }],
        };
        let svg = chart.svg();
        assert_eq!(svg.matches("<circle").count(), 3);
        assert!(svg.contains("t &lt;&amp;&gt;"));
        let empty = Chart {
            series: vec![],
            ..chart
        };
        assert!(empty.svg().contains("no data"));
    }
}

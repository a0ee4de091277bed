//! `cargo xtask spark-diff`: a randomized differential test against Apache Spark.
//!
//! Generates small streaming scenarios in the conformance corpus's format (windows,
//! joins, dedups, unions, filters; late, out-of-order and null-keyed rows), records what
//! a local Spark does with them (`spark_diff/record.py`, classic PySpark: an oracle that
//! never goes through ETLantic's plan), and replays them on the embedded runtime
//! (`etlantic conformance spark`). Recorded scenarios are kept in
//! `tests/conformance/spark-diff/` (the test suite replays them); the ones the runtime
//! gets wrong are the differences to fix.

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// A small deterministic generator (xorshift64*): the same seed gives the same scenarios.
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

fn ts(second: u64) -> String {
    format!("2024-01-01T00:{:02}:{:02}Z", second / 60, second % 60)
}

fn secs(n: u64) -> String {
    format!("{n} seconds")
}

/// Event times of a source over `batches` batches: mostly moving forward, some late.
fn times(rng: &mut Rng, batches: usize, per_batch: u64) -> Vec<Vec<u64>> {
    let mut clock = rng.below(10);
    (0..batches)
        .map(|_| {
            (0..rng.below(per_batch + 1))
                .map(|_| {
                    clock += rng.below(8);
                    if rng.chance(20) {
                        clock.saturating_sub(rng.below(25))
                    } else {
                        clock
                    }
                })
                .collect()
        })
        .collect()
}

fn maybe_null(rng: &mut Rng, v: Value) -> Value {
    if rng.chance(12) {
        Value::Null
    } else {
        v
    }
}

fn events_schema() -> Value {
    json!({"schema": [
        {"name": "ts", "type": "timestamp"},
        {"name": "user", "type": "string"},
        {"name": "amount", "type": "long"}
    ]})
}

fn event_rows(rng: &mut Rng, times: &[u64]) -> Vec<Value> {
    times
        .iter()
        .map(|&t| {
            let user = json!(rng.pick(&["a", "b", "c"]));
            let amount = json!(rng.below(12));
            json!({"ts": ts(t), "user": maybe_null(rng, user), "amount": maybe_null(rng, amount)})
        })
        .collect()
}

fn filter(rng: &mut Rng) -> Value {
    let atom = |rng: &mut Rng| -> Value {
        match rng.below(4) {
            0 => {
                json!({"col": "user", "op": rng.pick(&["=", "!="]), "value": rng.pick(&["a", "b"])})
            }
            1 => {
                json!({"col": "amount", "op": rng.pick(&[">", "<=", ">="]), "value": rng.below(10)})
            }
            2 => {
                json!({"col": rng.pick(&["user", "amount"]), "op": rng.pick(&["is_null", "is_not_null"])})
            }
            _ => json!({"col": "ts", "op": ">", "value": ts(rng.below(30))}),
        }
    };
    match rng.below(4) {
        0 => json!({"and": [atom(rng), atom(rng)]}),
        1 => json!({"or": [atom(rng), atom(rng)]}),
        _ => atom(rng),
    }
}

/// The input of a single-input kind: one source, or a union of two.
fn single_input(rng: &mut Rng, q: &mut Value, sources: &mut Value, batches: &mut [Value]) {
    let union = rng.chance(40);
    let names: &[&str] = if union { &["a", "b"] } else { &["events"] };
    let mut inputs = Vec::new();
    for name in names {
        sources[*name] = events_schema();
        let delay = secs(rng.below(11));
        for (i, t) in times(rng, batches.len(), 4).iter().enumerate() {
            batches[i][*name] = json!(event_rows(rng, t));
        }
        inputs.push(json!({"source": name, "watermark": {"column": "ts", "delay": delay}}));
    }
    if union {
        q["union"] = json!(inputs);
    } else {
        q["source"] = json!("events");
        q["watermark"] = inputs[0]["watermark"].clone();
    }
}

/// Scenario `n` of the seeded sequence.
pub fn scenario(rng: &mut Rng, n: usize) -> Value {
    let batch_count = 2 + rng.below(3) as usize;
    let mut batches: Vec<Value> = vec![json!({}); batch_count];
    let mut sources = json!({});
    let mut q = json!({});
    let kind = *rng.pick(&[
        "project_filter",
        "dedup",
        "window_aggregate",
        "stream_stream_join",
    ]);
    q["kind"] = json!(kind);
    match kind {
        "project_filter" => {
            single_input(rng, &mut q, &mut sources, &mut batches);
            q["filter"] = filter(rng);
            q["output_mode"] = json!("append");
        }
        "dedup" => {
            single_input(rng, &mut q, &mut sources, &mut batches);
            let within = rng.chance(40);
            q["mode"] = json!(if within {
                "within_watermark"
            } else {
                "drop_duplicates"
            });
            q["keys"] = if within {
                json!(["user"])
            } else {
                json!(["user", "ts"])
            };
            if rng.chance(40) {
                q["filter"] = filter(rng);
            }
        }
        "window_aggregate" => {
            single_input(rng, &mut q, &mut sources, &mut batches);
            if rng.chance(50) {
                q["filter"] = filter(rng);
            }
            q["window"] =
                json!({"type": "tumbling", "column": "ts", "size": secs(5 + 5 * rng.below(3))});
            q["group_by"] = json!(["user"]);
            q["aggregates"] = json!([{"fn": "count", "as": "cnt"}, {"fn": "sum", "column": "amount", "as": "total"}]);
            q["output_mode"] = json!(rng.pick(&["append", "update"]));
        }
        _ => {
            sources["impressions"] = json!({"schema": [
                {"name": "imp_ts", "type": "timestamp"}, {"name": "ad_id", "type": "string"}]});
            sources["clicks"] = json!({"schema": [
                {"name": "click_ts", "type": "timestamp"}, {"name": "ad_id", "type": "string"}]});
            for (name, col) in [("impressions", "imp_ts"), ("clicks", "click_ts")] {
                for (i, t) in times(rng, batch_count, 3).iter().enumerate() {
                    let rows: Vec<Value> = t
                        .iter()
                        .map(|&t| {
                            let ad = json!(rng.pick(&["x", "y", "z"]));
                            json!({col: ts(t), "ad_id": maybe_null(rng, ad)})
                        })
                        .collect();
                    batches[i][name] = json!(rows);
                }
            }
            q["left"] = json!({"source": "impressions", "watermark": {"column": "imp_ts", "delay": secs(rng.below(11))}});
            q["right"] = json!({"source": "clicks", "watermark": {"column": "click_ts", "delay": secs(rng.below(11))}});
            q["keys"] = json!([{"left": "ad_id", "right": "ad_id"}]);
            q["time_range"] = json!({"left": "imp_ts", "right": "click_ts",
                "lower": secs(rng.below(21)), "upper": secs(rng.below(6))});
            q["join_type"] = json!(rng.pick(&["inner", "left_outer", "right_outer"]));
            q["select"] = json!([
                {"from": "left", "col": "ad_id", "as": "imp_ad"}, {"from": "left", "col": "imp_ts"},
                {"from": "right", "col": "ad_id", "as": "click_ad"}, {"from": "right", "col": "click_ts"}]);
        }
    }
    // An empty batch at the end lets the last watermark advance emit what it closes.
    batches.push(json!({}));
    json!({
        "name": format!("rnd_{n:04}_{kind}"),
        "description": "generated by cargo xtask spark-diff",
        "sources": sources,
        "query": q,
        "batches": batches,
    })
}

/// Options of `cargo xtask spark-diff`.
pub struct Options<'a> {
    /// How many scenarios.
    pub count: usize,
    /// The generator's seed.
    pub seed: u64,
    /// Where recorded scenarios are kept (committed).
    pub keep: &'a Path,
    /// A scratch directory.
    pub work: &'a Path,
    /// The spark virtualenv's python.
    pub python: &'a Path,
    /// The `etlantic` CLI that replays them.
    pub etlantic: &'a Path,
}

/// Generates, records and replays; fails when the runtime disagrees with Spark.
pub fn run(root: &Path, o: &Options<'_>) -> Result<()> {
    let inputs = o.work.join("inputs");
    let recorded = o.work.join("recorded");
    let _ = std::fs::remove_dir_all(o.work);
    std::fs::create_dir_all(&inputs)?;
    let mut rng = Rng::new(o.seed);
    let mut paths = Vec::new();
    for n in 0..o.count {
        let mut s = scenario(&mut rng, n);
        s["name"] = json!(format!(
            "{}_s{}",
            s["name"].as_str().unwrap_or("rnd"),
            o.seed
        ));
        let path = inputs.join(format!("{}.in.json", s["name"].as_str().unwrap_or("rnd")));
        std::fs::write(&path, serde_json::to_string_pretty(&s)?)?;
        paths.push(path);
    }
    eprintln!("recording {} scenarios on the local Spark", paths.len());
    let status = Command::new(o.python)
        .arg(root.join("xtask/spark_diff/record.py"))
        .arg(&recorded)
        .args(&paths)
        .status()
        .context("cannot run the recorder")?;
    if !status.success() {
        bail!("the recorder failed");
    }
    eprintln!("replaying on the embedded runtime");
    let out = Command::new(o.etlantic)
        .args(["conformance", "spark"])
        .arg(&recorded)
        .output()
        .context("cannot run etlantic conformance")?;
    let text = String::from_utf8_lossy(&out.stdout);
    print!("{text}");
    std::fs::create_dir_all(o.keep)?;
    for e in std::fs::read_dir(&recorded)?.flatten() {
        std::fs::copy(e.path(), o.keep.join(e.file_name()))?;
    }
    eprintln!(
        "kept the recorded scenarios in {} (the test suite replays them)",
        o.keep.display()
    );
    if !out.status.success() {
        bail!("the embedded runtime differs from Spark (see above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_scenarios_and_every_kind_comes_up() {
        let gen = |seed| {
            let mut rng = Rng::new(seed);
            (0..40).map(|n| scenario(&mut rng, n)).collect::<Vec<_>>()
        };
        assert_eq!(gen(7), gen(7));
        assert_ne!(gen(7), gen(8));
        let kinds: std::collections::BTreeSet<String> = gen(7)
            .iter()
            .map(|s| s["query"]["kind"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(kinds.len(), 4, "{kinds:?}");
        for s in gen(3) {
            // Every batch names only declared sources, and the last one is empty.
            let batches = s["batches"].as_array().unwrap();
            assert_eq!(batches.last().unwrap(), &json!({}));
            for b in batches {
                for name in b.as_object().unwrap().keys() {
                    assert!(s["sources"].get(name).is_some(), "{name} in {s}");
                }
            }
        }
    }
}

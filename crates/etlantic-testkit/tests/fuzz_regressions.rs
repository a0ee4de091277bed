//! The fuzz harnesses of `cargo xtask fuzz` on every seed, on every input a fuzzer ever
//! found a crash with (`fuzz/regressions/<target>/`, kept as regression tests), and on
//! a few hundred deterministic mutations of each seed: a short fuzzing smoke run in the
//! normal test suite. A panic names the target and writes the input under the system's
//! temporary directory so that it can be replayed.

use etlantic_testkit::fuzz::{mutations, seeds, TARGETS};
use std::path::PathBuf;

fn regressions(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out: Vec<(String, Vec<u8>)> = entries
        .flatten()
        .map(|e| {
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// Runs the harness on one input; on a panic, keeps the input and fails naming it.
fn run(target: &str, label: &str, harness: fn(&[u8]), input: &[u8]) {
    let result = std::panic::catch_unwind(|| harness(input));
    if result.is_err() {
        let path = std::env::temp_dir().join(format!("etlantic-fuzz-{target}-{label}"));
        std::fs::write(&path, input).unwrap();
        panic!(
            "fuzz target `{target}` panicked on {label}; input kept in {}",
            path.display()
        );
    }
}

#[test]
fn every_harness_survives_its_seeds_regressions_and_mutations() {
    for (target, harness) in TARGETS {
        let seeds = seeds(target);
        assert!(!seeds.is_empty(), "`{target}` has seeds");
        for (i, seed) in seeds.iter().enumerate() {
            run(target, &format!("seed-{i}"), *harness, seed);
            for (j, m) in mutations(seed, (i * 7919 + j_base(target)) as u64, 150)
                .iter()
                .enumerate()
            {
                run(target, &format!("seed-{i}-mutation-{j}"), *harness, m);
            }
        }
        for (name, input) in regressions(target) {
            run(target, &name, *harness, &input);
        }
    }
}

/// A per-target offset of the mutation seeds.
fn j_base(target: &str) -> usize {
    target.bytes().map(usize::from).sum()
}

//! The one fuzz target: `ETLANTIC_FUZZ_TARGET` names the harness of
//! `etlantic_testkit::fuzz` it runs. With `ETLANTIC_FUZZ_SEEDS=<dir>` it first writes that
//! harness's seeds into `<dir>` (the corpus `cargo xtask fuzz` starts from).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

static HARNESS: OnceLock<fn(&[u8])> = OnceLock::new();

fn init() {
    let target = std::env::var("ETLANTIC_FUZZ_TARGET")
        .expect("set ETLANTIC_FUZZ_TARGET to a harness of etlantic_testkit::fuzz");
    let harness = etlantic_testkit::fuzz::harness(&target)
        .unwrap_or_else(|| panic!("no fuzz harness `{target}`"));
    if let Some(dir) = std::env::var_os("ETLANTIC_FUZZ_SEEDS") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("the corpus directory");
        for (i, seed) in etlantic_testkit::fuzz::seeds(&target).iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), seed).expect("a seed file");
        }
    }
    // libFuzzer's hook aborts on every panic, also on those a reader of untrusted input
    // catches and turns into an error (`etlantic_core::untrusted::decode`): let those
    // unwind, as they do in a real run.
    etlantic_testkit::fuzz::quiet_guarded_panics();
    let _ = HARNESS.set(harness);
}

fuzz_target!(init: init(), |data: &[u8]| {
    (HARNESS.get().expect("initialised"))(data);
});

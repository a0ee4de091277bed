//! Fault injection for crash-recovery tests.
//!
//! Setting the environment variable `ETLANTIC_FAIL_POINT=<point>:<batch id>` makes the
//! process `abort()` — no destructors, no flushing, like a power cut or `kill -9` — when
//! it reaches `<point>` while processing micro-batch `<batch id>`. The streaming driver
//! knows `after_offsets`, `after_sink`, `after_state` and `after_commit`; a sink with a
//! commit protocol calls [`check`] with [`IN_SINK`] between staging a batch and making
//! it visible (e.g. after writing data files and before the table commit), so that tests
//! can kill it in the middle of the write.
//!
//! Unset (the normal case) every check is one environment lookup.

/// The point "in the middle of a sink's write": data staged, not yet committed.
pub const IN_SINK: &str = "in_sink";

/// The variable that arms a fail point.
pub const FAIL_POINT_VAR: &str = "ETLANTIC_FAIL_POINT";

/// The armed fail point, when the variable is set and well formed.
pub fn armed() -> Option<(String, u64)> {
    let v = std::env::var(FAIL_POINT_VAR).ok()?;
    let (p, n) = v.split_once(':')?;
    Some((p.to_string(), n.parse().ok()?))
}

/// Aborts the process when `point` is armed for `batch_id`.
pub fn check(point: &str, batch_id: u64) {
    if let Some((p, n)) = armed() {
        if p == point && n == batch_id {
            eprintln!("ETLANTIC_FAIL_POINT reached: {point} of batch {batch_id}; aborting");
            std::process::abort();
        }
    }
}

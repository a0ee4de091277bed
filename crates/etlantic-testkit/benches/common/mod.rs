//! Helpers the benchmarks share.

/// CPU seconds (user + system, all threads) of this process so far, to the
/// nanosecond: `/proc/self/stat` counts 10 ms ticks, a tenth of q3's whole run.
pub fn cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "the process CPU clock is readable");
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// The value after the command-line flag `name`.
pub fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

//! Running third-party decoders on bytes that come from disk or from users.
//!
//! Some decoders this project builds on panic on malformed input instead of returning an
//! error (Arrow's IPC reader on an unknown type id, for one). Bad input must never crash
//! a query, so readers of untrusted bytes call such decoders through [`decode`], which
//! turns a panic into an error with the caller's code. A decoder that *aborts* (an
//! allocation of a length read from the input) cannot be caught this way: check such
//! lengths before decoding (see the checkpoint's IPC checks).

use crate::diagnostics::Error;

thread_local! {
    static GUARDED: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Runs `read`, turning a panic inside it into the error `on_panic` builds from the
/// panic's message.
pub fn decode<T>(
    read: impl FnOnce() -> Result<T, Error>,
    on_panic: impl FnOnce(&str) -> Error,
) -> Result<T, Error> {
    GUARDED.with(|g| g.set(g.get() + 1));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(read));
    GUARDED.with(|g| g.set(g.get() - 1));
    outcome.unwrap_or_else(|payload| {
        let why = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(on_panic(why))
    })
}

/// Wraps the process's panic hook so that it is skipped for panics [`decode`] turns into
/// errors: the CLI does not print a backtrace for a malformed file it quarantines, and a
/// fuzzer's hook (which aborts on any panic) lets them unwind to [`decode`]. Every other
/// panic still reaches the previous hook.
pub fn quiet_guarded_panics() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !is_guarded() {
            previous(info);
        }
    }));
}

/// Whether this thread is inside [`decode`], where a panic becomes an error: a panic
/// hook that aborts on every panic (a fuzzer's) asks this to let such panics unwind.
pub fn is_guarded() -> bool {
    GUARDED.with(|g| g.get() > 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostics::codes;

    #[test]
    fn a_panic_becomes_the_callers_error() {
        let r: Result<(), Error> = decode(
            || panic!("unknown type id 255"),
            |why| Error::new(&codes::CHECKPOINT_CORRUPT, format!("bad file: {why}")),
        );
        let e = r.unwrap_err();
        assert!(!is_guarded(), "the guard ends with the call");
        assert_eq!(e.code(), "ETL801");
        assert!(e.to_string().contains("unknown type id 255"));
        let ok: Result<u8, Error> = decode(|| Ok(7), |_| unreachable!());
        assert_eq!(ok.unwrap(), 7);
    }
}

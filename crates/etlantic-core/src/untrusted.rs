//! Running third-party decoders on bytes that come from disk or from users.
//!
//! Some decoders this project builds on panic on malformed input instead of returning an
//! error (Arrow's IPC reader on an unknown type id, for one). Bad input must never crash
//! a query, so readers of untrusted bytes call such decoders through [`decode`], which
//! turns a panic into an error with the caller's code. A decoder that *aborts* (an
//! allocation of a length read from the input) cannot be caught this way: check such
//! lengths before decoding (see the checkpoint's IPC checks).

use crate::diagnostics::Error;

/// Runs `read`, turning a panic inside it into the error `on_panic` builds from the
/// panic's message.
pub fn decode<T>(
    read: impl FnOnce() -> Result<T, Error>,
    on_panic: impl FnOnce(&str) -> Error,
) -> Result<T, Error> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(read)).unwrap_or_else(|payload| {
        let why = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("a panic");
        Err(on_panic(why))
    })
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
        assert_eq!(e.code(), "ETL801");
        assert!(e.to_string().contains("unknown type id 255"));
        let ok: Result<u8, Error> = decode(|| Ok(7), |_| unreachable!());
        assert_eq!(ok.unwrap(), 7);
    }
}

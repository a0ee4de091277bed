//! Errors of the Polars backend as ETLantic diagnostics.
//!
//! `ETL501` for what this backend does not implement (an action, a function, a form of
//! an expression or a column type), `ETL206` for an unknown column, `ETL302` for a type
//! mismatch, `ETL209` for a missing runtime parameter, and `ETL707` for anything Polars
//! or Arrow report while running (integer overflow, division by zero, ...).

use etlantic_core::diagnostics::{codes, CodeInfo, Diagnostic};
use etlantic_core::Error;
use polars::prelude::PolarsError;

/// A diagnostic error with the given code.
pub(crate) fn err(code: &CodeInfo, message: impl Into<String>) -> Error {
    Error::new(code, message)
}

/// `ETL501`: something this backend does not implement.
pub(crate) fn unsupported(message: impl std::fmt::Display) -> Error {
    err(
        &codes::BACKEND_UNSUPPORTED_ACTION,
        format!("the `polars` backend does not support {message}"),
    )
}

/// `ETL302`: values of the wrong type.
pub(crate) fn type_mismatch(message: impl Into<String>) -> Error {
    err(&codes::TYPE_MISMATCH, message)
}

/// `ETL006`: the plan cannot be compiled for these inputs.
pub(crate) fn invalid_plan(message: impl Into<String>) -> Error {
    err(&codes::TRANSFORM_PLAN_INVALID, message)
}

/// `ETL206`: a column the input does not have.
pub(crate) fn unknown_column(name: &str, available: &[String]) -> Error {
    Diagnostic::new(
        &codes::UNKNOWN_COLUMN,
        format!(
            "no column `{name}` in the input (columns: {})",
            if available.is_empty() {
                "none".to_string()
            } else {
                available.join(", ")
            }
        ),
    )
    .into()
}

/// `ETL707`: an engine failure.
pub(crate) fn engine(message: impl Into<String>) -> Error {
    err(&codes::ENGINE_ERROR, message)
}

/// Maps a Polars error (`ETL707`), prefixing `context`.
pub(crate) fn polars(e: PolarsError, context: &str) -> Error {
    engine(format!("{context}: Polars: {e}"))
}

/// Maps an Arrow error (`ETL707`), prefixing `context`.
pub(crate) fn arrow(e: arrow::error::ArrowError, context: &str) -> Error {
    engine(format!("{context}: Arrow: {e}"))
}

/// Extension to map Polars results.
pub(crate) trait PlResultExt<T> {
    /// Maps the error with [`polars`].
    fn pl(self, context: &str) -> etlantic_core::Result<T>;
}

impl<T> PlResultExt<T> for Result<T, PolarsError> {
    fn pl(self, context: &str) -> etlantic_core::Result<T> {
        self.map_err(|e| polars(e, context))
    }
}

/// Sets the path of every diagnostic of `e` that has none.
pub(crate) fn at(e: Error, path: &str) -> Error {
    e.map_diagnostics(|d| if d.path.is_empty() { d.at(path) } else { d })
}

//! Errors of the engine as ETLantic diagnostics.
//!
//! Everything a user can cause ends up as an [`etlantic_core::Error`] with a stable code:
//! `ETL206` for a column the input does not have, `ETL302` for a type mismatch, `ETL306`
//! for a function outside the DTCS registry, `ETL501` for a registered action or function
//! this backend does not implement, `ETL209` for a missing runtime parameter, and `ETL707`
//! for any other failure reported by DataFusion or Arrow.

use datafusion::common::SchemaError;
use datafusion::error::DataFusionError;
use etlantic_core::diagnostics::{codes, CodeInfo, Diagnostic};
use etlantic_core::Error;

/// A diagnostic error with the given code.
pub(crate) fn err(code: &CodeInfo, message: impl Into<String>) -> Error {
    Error::new(code, message)
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

/// `ETL302`: values of the wrong type.
pub(crate) fn type_mismatch(message: impl Into<String>) -> Error {
    err(&codes::TYPE_MISMATCH, message)
}

/// `ETL006`: the plan cannot be compiled for these inputs (duplicate output names,
/// colliding join columns, ...).
pub(crate) fn invalid_plan(message: impl Into<String>) -> Error {
    err(&codes::TRANSFORM_PLAN_INVALID, message)
}

/// `ETL501`: something this backend does not implement.
pub(crate) fn unsupported(message: impl Into<String>) -> Error {
    err(&codes::BACKEND_UNSUPPORTED_ACTION, message)
}

/// `ETL707`: an engine failure.
pub(crate) fn engine(message: impl Into<String>) -> Error {
    err(&codes::ENGINE_ERROR, message)
}

/// The code a DataFusion error maps to.
fn classify(e: &DataFusionError) -> &'static CodeInfo {
    match e.find_root() {
        DataFusionError::SchemaError(se, _) => match se.as_ref() {
            SchemaError::FieldNotFound { .. } => &codes::UNKNOWN_COLUMN,
            _ => &codes::ENGINE_ERROR,
        },
        DataFusionError::Plan(msg) => {
            let m = msg.to_ascii_lowercase();
            if m.starts_with("ddl not supported")
                || m.starts_with("dml not supported")
                || m.starts_with("statement not supported")
            {
                &codes::BACKEND_UNSUPPORTED_ACTION
            } else if m.contains("coerc")
                || m.contains("cannot infer common")
                || m.contains("no function matches")
                || m.contains("does not support")
                || m.contains("not supported")
                || m.contains("type mismatch")
                || m.contains("unsupported data type")
                || m.contains("cannot be cast")
            {
                &codes::TYPE_MISMATCH
            } else {
                &codes::ENGINE_ERROR
            }
        }
        _ => &codes::ENGINE_ERROR,
    }
}

/// Maps a DataFusion error, prefixing `context` to the message.
pub(crate) fn datafusion(e: DataFusionError, context: &str) -> Error {
    let code = classify(&e);
    let text = e.find_root().to_string();
    let message = if context.is_empty() {
        format!("DataFusion: {text}")
    } else {
        format!("{context}: DataFusion: {text}")
    };
    Diagnostic::new(code, message).into()
}

/// Maps an Arrow error.
pub(crate) fn arrow(e: arrow::error::ArrowError, context: &str) -> Error {
    engine(format!("{context}: Arrow: {e}"))
}

/// Extension to map DataFusion results.
pub(crate) trait DfResultExt<T> {
    /// Maps the error with [`datafusion`].
    fn df(self, context: &str) -> etlantic_core::Result<T>;
}

impl<T> DfResultExt<T> for Result<T, DataFusionError> {
    fn df(self, context: &str) -> etlantic_core::Result<T> {
        self.map_err(|e| datafusion(e, context))
    }
}

/// Prefixes the message of every diagnostic of `e`.
pub(crate) fn prefixed(e: Error, prefix: &str) -> Error {
    e.map_diagnostics(|mut d| {
        d.message = format!("{prefix}: {}", d.message);
        d
    })
}

/// Replaces the hint of every diagnostic of `e`.
pub(crate) fn with_help(e: Error, help: &str) -> Error {
    e.map_diagnostics(|d| d.help(help))
}

/// Sets the path of every diagnostic of `e` that has none.
pub(crate) fn at(e: Error, path: &str) -> Error {
    e.map_diagnostics(|d| if d.path.is_empty() { d.at(path) } else { d })
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::common::Column;

    #[test]
    fn datafusion_errors_get_codes() {
        let missing = DataFusionError::SchemaError(
            Box::new(SchemaError::FieldNotFound {
                field: Box::new(Column::from_name("x")),
                valid_fields: vec![],
            }),
            Box::new(None),
        );
        assert_eq!(datafusion(missing, "step").code(), "ETL206");
        let coercion = DataFusionError::Plan("Cannot infer common argument type".into());
        assert_eq!(datafusion(coercion, "").code(), "ETL302");
        let exec = DataFusionError::Execution("boom".into());
        let e = datafusion(exec, "ctx");
        assert_eq!(e.code(), "ETL707");
        assert!(e.to_string().contains("ctx: DataFusion"));
        assert_eq!(
            at(e, "steps[a]").diagnostics().iter().next().unwrap().path,
            "steps[a]"
        );
    }
}

//! Reading YAML documents into model types with diagnostics that carry a code, the file
//! and the line.

use crate::diagnostics::{codes, Diagnostic, Error, Result};
use serde::de::DeserializeOwned;
use std::path::Path;

/// Deserialises `text`; syntax and shape errors become `ETL002`, unknown fields `ETL003`.
pub fn from_str<T: DeserializeOwned>(text: &str, origin: &str) -> Result<T> {
    serde_yaml::from_str(text).map_err(|e| yaml_error(&e, origin))
}

/// Converts a serde_yaml error into a diagnostic.
pub fn yaml_error(e: &serde_yaml::Error, origin: &str) -> Error {
    let msg = e.to_string();
    let code = if msg.contains("unknown field") || msg.contains("unknown variant") {
        &codes::UNKNOWN_FIELD
    } else {
        &codes::YAML_SYNTAX
    };
    let mut d = Diagnostic::new(code, format!("{origin}: {msg}")).in_file(origin);
    // serde_yaml prefixes errors below the root with their path: `sources[0]: unknown field`.
    if let Some((path, _)) = msg.split_once(": ") {
        if !path.is_empty() && !path.contains(char::is_whitespace) {
            d = d.at(path);
        }
    }
    if let Some(loc) = e.location() {
        d = d.on_line(loc.line() as u64);
    }
    d.into()
}

/// Reads a text file; a missing or unreadable file is `ETL001`.
pub fn read_file(path: &Path, origin: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|e| {
        Error::from(
            Diagnostic::new(
                &codes::FILE_UNREADABLE,
                format!("cannot read `{origin}`: {e}"),
            )
            .in_file(origin),
        )
    })
}

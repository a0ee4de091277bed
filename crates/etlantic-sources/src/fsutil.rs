//! File-system helpers of the connectors: the durable writes live in
//! [`etlantic_core::durable`].

use std::path::Path;

pub(crate) use etlantic_core::durable::io_error;

/// `path` relative to `root` with `/` separators when it is inside `root`, else as is.
pub(crate) fn display_relative(path: &Path, root: &Path) -> String {
    match path.strip_prefix(root) {
        Ok(rel) => rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/"),
        Err(_) => path.to_string_lossy().into_owned(),
    }
}

//! etlantic-polars

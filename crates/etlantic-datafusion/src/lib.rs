//! etlantic-datafusion

//! etlantic-sinks

//! etlantic-sources

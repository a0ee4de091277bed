//! etlantic facade

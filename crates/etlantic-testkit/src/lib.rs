//! etlantic-testkit

//! etlantic-plan

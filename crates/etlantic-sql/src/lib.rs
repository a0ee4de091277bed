//! etlantic-sql

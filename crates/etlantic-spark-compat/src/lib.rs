//! etlantic-spark-compat

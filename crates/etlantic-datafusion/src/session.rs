//! The DataFusion session every step runs in.
//!
//! One target partition: a batch region is small enough for one machine by definition,
//! single-partition plans keep results deterministic (hash tables use fixed seeds), and
//! row order is carried explicitly anyway (see [`crate::relation`]).

use datafusion::prelude::{SessionConfig, SessionContext};

/// A fresh session configured for ETLantic steps.
pub fn new_context() -> SessionContext {
    let config = SessionConfig::new()
        .with_target_partitions(1)
        .with_information_schema(false);
    SessionContext::new_with_config(config)
}

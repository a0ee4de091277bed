//! The DataFusion session every step runs in.
//!
//! One target partition: a batch region is small enough for one machine by definition,
//! single-partition plans keep results deterministic (hash tables use fixed seeds), and
//! row order is carried explicitly anyway (see [`crate::relation`]).

use datafusion::prelude::{SessionConfig, SessionContext};

/// A fresh session configured for ETLantic steps.
pub fn new_context() -> SessionContext {
    SessionContext::new_with_config(config())
}

fn config() -> SessionConfig {
    SessionConfig::new()
        .with_target_partitions(1)
        .with_information_schema(false)
}

/// A session for plans that are planned once and run many times (see
/// [`crate::streaming::stateless::PreparedSteps`]): as [`new_context`], with dynamic
/// filters off, since they would carry one run's values into the next.
pub fn new_reusable_context() -> SessionContext {
    // Turns off the join, top-k and aggregate dynamic filters alike.
    let config = config().set_bool("datafusion.optimizer.enable_dynamic_filter_pushdown", false);
    SessionContext::new_with_config(config)
}

//! File-system helpers of the connectors: the durable writes live in
//! [`etlantic_core::durable`].

pub(crate) use etlantic_core::durable::{io_error, write_atomic, write_atomic_with};

//! # etlantic-sql
//!
//! The SQL-region backends: portable DTCS steps compiled to SQL and run inside
//! PostgreSQL (`postgres`) or SQLite (`sqlite`) through `sqlx`, so that data living in
//! the database is transformed there.
//!
//! - [`compile`]: DTCS actions and expressions to one `WITH` query per output, keeping
//!   DTCS semantics (row order, three-valued logic, null handling);
//! - [`dialect`]: the two dialects and how each stores portable value types;
//! - [`backend`]: [`SqlBackend`], which stages Arrow inputs into temporary tables, runs
//!   the query in one rolled-back transaction and returns Arrow;
//! - [`capabilities`]: exactly the actions and functions each dialect computes as DTCS
//!   defines them (the planner fails closed on anything else).
//!
//! Numeric tolerance: SQLite keeps decimals as binary floating point (`REAL`), and
//! float sums and averages depend on the order rows are added in; results of those
//! compare within a relative tolerance of 1e-9 (see `docs/equivalence.md`).
#![warn(missing_docs)]

pub mod backend;
pub mod capabilities;
pub mod compile;
pub mod dialect;
pub mod values;

pub use backend::SqlBackend;
pub use dialect::Dialect;

static POSTGRES: SqlBackend = SqlBackend::unbound(Dialect::Postgres);
static SQLITE: SqlBackend = SqlBackend::unbound(Dialect::Sqlite);

inventory::submit! { etlantic_core::plugin::BackendRegistration(&POSTGRES) }
inventory::submit! { etlantic_core::plugin::BackendRegistration(&SQLITE) }

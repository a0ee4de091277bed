//! State TTL: state rows that no update touched for a while are evicted, in processing
//! time.
//!
//! The clock is the micro-batch's batch timestamp, logged with the offsets before the
//! batch runs, so a replayed micro-batch expires exactly the same rows. A row updated at
//! `u` is expired at processing time `now` when `u + ttl <= now`; it is evicted before the
//! micro-batch's input is applied (a new row for its key starts a new state) and the
//! eviction emits nothing. Evicted rows count in `numRowsRemoved` and, separately, in the
//! `numRowsRemovedByTtl` custom metric of the operator's progress.
//!
//! TTL is set per operator from the profile's `state_ttl` (transformation id, or operator
//! id `<transformation>.<step>`) through [`super::operators::StatefulOperator::set_state_ttl`].
//! The aggregation and dedup operators keep an update time per group/key; an operator
//! that buffers rows (a stream-stream join) keeps one per row in a column named
//! [`UPDATED_COLUMN`] of its state and drops rows with [`StateTtl::retain_mask`]:
//!
//! ```text
//! // in process(), before the new input is matched and buffered:
//! if let Some(ttl) = &self.ttl {
//!     let keep = ttl.retain_mask(updated_ms_column, ctx.processing_time_ms);
//!     self.buffer = filter_record_batch(&self.buffer, &keep)?;   // count the dropped rows
//! }
//! // a buffered row gets `updated_ms = ctx.processing_time_ms` when it is added (and,
//! // if matches should keep it alive, when it matches)
//! ```

use arrow::array::{Array, BooleanArray, Int64Array};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::streaming::Duration;

/// The name of the per-row update-time column (epoch ms) in state snapshots.
pub const UPDATED_COLUMN: &str = "__updated_ms";

/// The progress custom metric counting rows evicted by TTL in a micro-batch.
pub const ROWS_REMOVED_BY_TTL: &str = "numRowsRemovedByTtl";

/// A state time-to-live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateTtl {
    ttl_ms: i64,
}

impl StateTtl {
    /// A TTL; it must be positive.
    pub fn new(ttl: Duration) -> Result<Self> {
        if ttl.as_millis() <= 0 {
            return Err(Error::new(
                &codes::BAD_DURATION,
                format!("a state TTL must be positive, got {ttl}"),
            ));
        }
        Ok(StateTtl {
            ttl_ms: ttl.as_millis(),
        })
    }

    /// The TTL in milliseconds.
    pub fn millis(&self) -> i64 {
        self.ttl_ms
    }

    /// Whether a row last updated at `updated_ms` is expired at processing time `now_ms`.
    /// A row with no recorded update time (`None`, e.g. restored from a checkpoint written
    /// before TTL was configured) is not.
    pub fn expired(&self, updated_ms: Option<i64>, now_ms: i64) -> bool {
        updated_ms.is_some_and(|u| u.saturating_add(self.ttl_ms) <= now_ms)
    }

    /// The rows to keep (`true`) of a column of update times.
    pub fn retain_mask(&self, updated_ms: &Int64Array, now_ms: i64) -> BooleanArray {
        (0..updated_ms.len())
            .map(|i| {
                let u = updated_ms.is_valid(i).then(|| updated_ms.value(i));
                Some(!self.expired(u, now_ms))
            })
            .collect()
    }
}

/// A column of `n` update times, all `now_ms` (for rows added in a micro-batch).
pub fn updated_now(n: usize, now_ms: i64) -> Int64Array {
    Int64Array::from(vec![now_ms; n])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_is_inclusive_and_ignores_unknown_update_times() {
        let ttl = StateTtl::new(Duration::from_secs(10)).unwrap();
        assert!(!ttl.expired(Some(1_000), 10_999));
        assert!(ttl.expired(Some(1_000), 11_000));
        assert!(!ttl.expired(None, i64::MAX));
        let col = Int64Array::from(vec![Some(0), None, Some(5_000), Some(1)]);
        let keep = ttl.retain_mask(&col, 10_001);
        assert_eq!(
            keep.iter().collect::<Vec<_>>(),
            [Some(false), Some(true), Some(true), Some(false)]
        );
        assert_eq!(updated_now(2, 7).values(), &[7, 7]);
        assert!(StateTtl::new(Duration::ZERO).is_err());
    }
}

//! Event-time watermarks with Spark's timing: per watermarked input,
//! `m = max event time seen so far - delay` (an input that has seen nothing counts as the
//! epoch); the global watermark is the minimum (or maximum) of the inputs' `m`; it is
//! computed after batch N, applied in batch N+1, never moves backwards, and has
//! millisecond precision.

use crate::engine::RowFilter;
use arrow::array::{ArrayRef, AsArray, RecordBatch, TimestampMicrosecondArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, TimeUnit, TimestampMicrosecondType};
use etlantic_core::diagnostics::{codes, Error, Result};
use etlantic_core::streaming::WatermarkPolicy;
use std::collections::BTreeMap;

/// Tracks the watermark of a query.
#[derive(Clone, Debug, PartialEq)]
pub struct WatermarkTracker {
    delays_ms: BTreeMap<String, i64>,
    max_event_ms: BTreeMap<String, i64>,
    policy: WatermarkPolicy,
    current_ms: i64,
}

impl WatermarkTracker {
    /// A tracker for inputs `source → delay (ms)`, starting at the epoch.
    pub fn new(delays_ms: BTreeMap<String, i64>, policy: WatermarkPolicy) -> Self {
        WatermarkTracker {
            delays_ms,
            max_event_ms: BTreeMap::new(),
            policy,
            current_ms: 0,
        }
    }

    /// Whether any input has a watermark.
    pub fn is_active(&self) -> bool {
        !self.delays_ms.is_empty()
    }

    /// Whether this source is watermarked.
    pub fn tracks(&self, source: &str) -> bool {
        self.delays_ms.contains_key(source)
    }

    /// The watermark in force (epoch milliseconds).
    pub fn current_ms(&self) -> i64 {
        self.current_ms
    }

    /// The maximum event time seen per input (epoch milliseconds).
    pub fn max_event_times(&self) -> &BTreeMap<String, i64> {
        &self.max_event_ms
    }

    /// Records the maximum event time (µs) of a batch of `source`.
    pub fn observe(&mut self, source: &str, max_event_us: i64) {
        if !self.delays_ms.contains_key(source) {
            return;
        }
        let ms = max_event_us.div_euclid(1000);
        let e = self.max_event_ms.entry(source.to_string()).or_insert(ms);
        *e = (*e).max(ms);
    }

    /// The watermark the next batch will use (not yet applied).
    pub fn next_ms(&self) -> i64 {
        let candidates = self
            .delays_ms
            .iter()
            .map(|(s, d)| match self.max_event_ms.get(s) {
                Some(m) => m - d,
                None => 0,
            });
        let global = match self.policy {
            WatermarkPolicy::Min => candidates.min(),
            WatermarkPolicy::Max => candidates.max(),
        };
        global.map_or(self.current_ms, |g| g.max(self.current_ms))
    }

    /// Applies the next watermark; returns whether it moved.
    pub fn advance(&mut self) -> bool {
        let next = self.next_ms();
        let moved = next > self.current_ms;
        self.current_ms = next;
        moved
    }

    /// Restores state from a checkpoint.
    pub fn restore(&mut self, current_ms: i64, max_event_ms: BTreeMap<String, i64>) {
        self.current_ms = current_ms;
        self.max_event_ms = max_event_ms;
    }
}

/// The rows of a source its watermark is measured on: those where the plan's predicate
/// is true (`PlanSource::watermark_rows`: the filters Spark's optimizer would move below
/// the watermark), evaluated by the query's engine.
pub struct MeasuredRows {
    filter: Box<dyn RowFilter>,
}

impl MeasuredRows {
    /// The rows `filter` selects.
    pub fn new(filter: Box<dyn RowFilter>) -> Self {
        MeasuredRows { filter }
    }

    /// The event times `times` of `batch`'s rows, of the measured rows only.
    pub fn select(
        &mut self,
        batch: &RecordBatch,
        times: TimestampMicrosecondArray,
    ) -> Result<TimestampMicrosecondArray> {
        let mask = self.filter.evaluate(batch)?;
        let kept = arrow::compute::filter(&times, &mask)
            .map_err(|e| Error::new(&codes::ENGINE_ERROR, format!("arrow: {e}")))?;
        Ok(kept.as_primitive::<TimestampMicrosecondType>().clone())
    }
}

/// Event times of a timestamp column in microseconds.
pub fn micros(col: &ArrayRef) -> Result<TimestampMicrosecondArray> {
    let tz = match col.data_type() {
        DataType::Timestamp(_, tz) => tz.clone(),
        other => {
            return Err(Error::new(
                &codes::BAD_WATERMARK,
                format!("event time must be a timestamp, got {other}"),
            ))
        }
    };
    let c = cast(col, &DataType::Timestamp(TimeUnit::Microsecond, tz))
        .map_err(|e| Error::new(&codes::ENGINE_ERROR, e.to_string()))?;
    Ok(c.as_primitive::<TimestampMicrosecondType>().clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: i64 = 1_704_067_200_000; // 2024-01-01T00:00:00Z in ms

    #[test]
    fn min_over_inputs_never_backwards() {
        let mut w = WatermarkTracker::new(
            BTreeMap::from([("a".into(), 5_000), ("b".into(), 20_000)]),
            WatermarkPolicy::Min,
        );
        w.observe("a", (T0 + 12_000) * 1000);
        w.observe("a", (T0 + 1_000) * 1000);
        w.observe("b", (T0 + 2_000) * 1000);
        assert!(w.advance());
        assert_eq!(w.current_ms(), T0 - 18_000);
        w.observe("a", (T0 + 40_000) * 1000);
        w.observe("b", (T0 + 25_000) * 1000);
        w.advance();
        assert_eq!(w.current_ms(), T0 + 5_000);
        w.observe("b", (T0 + 18_000) * 1000);
        assert!(!w.advance());
        assert_eq!(w.current_ms(), T0 + 5_000);
    }

    #[test]
    fn an_input_without_data_holds_the_min_at_the_epoch() {
        let mut w = WatermarkTracker::new(
            BTreeMap::from([("a".into(), 0), ("b".into(), 0)]),
            WatermarkPolicy::Min,
        );
        w.observe("a", T0 * 1000);
        assert!(!w.advance());
        assert_eq!(w.current_ms(), 0);
        let mut w = WatermarkTracker::new(
            BTreeMap::from([("a".into(), 0), ("b".into(), 0)]),
            WatermarkPolicy::Max,
        );
        w.observe("a", T0 * 1000);
        assert!(w.advance());
        assert_eq!(w.current_ms(), T0);
    }
}

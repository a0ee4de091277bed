//! Static sources of a streaming query (`static_refresh` on a source): bounded tables —
//! the static side of a stream-static join — read with the source plugin in bounded
//! mode, like a batch run reads them, instead of by offsets.
//!
//! - `per_batch`: read again for every micro-batch (Spark re-evaluates a static
//!   DataFrame in every micro-batch, so each one sees the table as it is then);
//! - `{interval: d}`: read once and kept; read again for the first micro-batch whose
//!   batch timestamp is `d` or more after the read.
//!
//! A static source takes no part in the offset log: it never triggers a micro-batch, and
//! a replayed micro-batch joins with the table as it is at the replay (as in Spark).
//! Records that break the contract are quarantined once per query run.

use etlantic_core::data::{RejectedRecord, Table};
use etlantic_core::diagnostics::Result;
use etlantic_core::plugin::{ReadLimit, Source};
use etlantic_core::streaming::StaticRefresh;
use std::collections::HashSet;

/// A static source and its cached table.
pub struct StaticSource {
    /// The source id (the relation it publishes).
    pub id: String,
    source: Box<dyn Source>,
    refresh: StaticRefresh,
    cached: Option<(i64, Table)>,
    reads: u64,
    reported: HashSet<String>,
}

impl StaticSource {
    /// Wraps a source created in bounded mode.
    pub fn new(id: impl Into<String>, source: Box<dyn Source>, refresh: StaticRefresh) -> Self {
        StaticSource {
            id: id.into(),
            source,
            refresh,
            cached: None,
            reads: 0,
            reported: HashSet::new(),
        }
    }

    /// How many times the table was read so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// The table for the micro-batch with timestamp `batch_ms`, and the records of a
    /// fresh read that broke the contract and were not reported before.
    pub async fn table(&mut self, batch_ms: i64) -> Result<(Table, Vec<RejectedRecord>)> {
        let fresh = match (&self.cached, self.refresh) {
            (None, _) | (Some(_), StaticRefresh::PerBatch) => true,
            (Some((at, _)), StaticRefresh::Interval(d)) => batch_ms - at >= d.as_millis(),
        };
        if !fresh {
            let (_, t) = self.cached.as_ref().expect("checked");
            return Ok((t.clone(), vec![]));
        }
        let batch = match self
            .source
            .latest_offset(None, &ReadLimit::unlimited())
            .await?
        {
            Some(end) => self.source.read(None, &end).await?,
            None => Default::default(),
        };
        self.reads += 1;
        let table = Table::new(self.source.schema(), batch.batches);
        let mut rejected = Vec::new();
        for r in batch.rejected {
            let key = format!("{}\u{1}{}\u{1}{}", r.code, r.reason, r.raw);
            if self.reported.insert(key) {
                rejected.push(r);
            }
        }
        self.cached = Some((batch_ms, table.clone()));
        Ok((table, rejected))
    }
}

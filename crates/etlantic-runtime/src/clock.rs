//! The processing-time clock of a streaming query.
//!
//! Each micro-batch's timestamp (logged with its offsets before it runs, reused when
//! it is replayed) comes from the query's [`Clock`]; state TTL and processing-time timers
//! follow it. [`StreamingOptions::clock`](super::StreamingOptions) is the system clock by
//! default; tests inject a [`ManualClock`] and move time by hand instead of sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Returns the current processing time in epoch milliseconds.
pub type Clock = Arc<dyn Fn() -> i64 + Send + Sync>;

/// The system clock.
pub fn system_clock() -> Clock {
    Arc::new(|| chrono::Utc::now().timestamp_millis())
}

/// A clock that moves only when told to.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now_ms: Arc<AtomicI64>,
}

impl ManualClock {
    /// A clock at `now_ms` (epoch milliseconds).
    pub fn new(now_ms: i64) -> Self {
        ManualClock {
            now_ms: Arc::new(AtomicI64::new(now_ms)),
        }
    }

    /// The current time (epoch ms).
    pub fn now_ms(&self) -> i64 {
        self.now_ms.load(Ordering::SeqCst)
    }

    /// Sets the time.
    pub fn set(&self, now_ms: i64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }

    /// Moves the time forward by `ms` milliseconds.
    pub fn advance(&self, ms: i64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// The clock to put in the options.
    pub fn clock(&self) -> Clock {
        let now = self.now_ms.clone();
        Arc::new(move || now.load(Ordering::SeqCst))
    }
}

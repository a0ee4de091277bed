//! Custom stateful processors linked by the facade (usable from pipeline YAML with a
//! `process` step), and a worked example of the
//! [`StatefulProcessor`](etlantic_core::plugin::StatefulProcessor) contract.
//!
//! ## `session_summary`
//!
//! Per key, groups events into sessions closed by `gap` of inactivity in event time and
//! emits one row per session once the watermark passes its end: the key columns,
//! `session_start` (first event), `session_end` (last event + `gap`) and `events`.
//!
//! ```yaml
//! - process:
//!     processor: session_summary
//!     keys: [user]
//!     time_mode: event_time                 # required: sessions close on event-time timers
//!     options:
//!       time_column: ts                     # a timestamp column of the input
//!       gap: 30 minutes
//!       ttl: 1 day                          # optional: forget a key's open sessions after a
//!                                           # day without input (processing time)
//! ```
//!
//! Sessions are Spark's session windows: an event at `t` starts `[t, t + gap)`, sessions
//! that overlap or touch merge, so the result equals
//! `window_aggregate: {window: {type: session, column: ts, gap: ...}, aggregates: {events: "count_all()"}}`
//! for on-time data. The state is a list of the key's open sessions (a
//! [`ListState`](etlantic_core::plugin::ListState), one element per session, with the
//! TTL); each open session has an event-time timer at its end.

use etlantic_core::arrow::array::RecordBatch;
use etlantic_core::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use etlantic_core::plugin::processor::{
    invalid, iso_millis, timestamp_millis, ExpiredTimer, GroupKey, ListState, ProcessorContext,
    ProcessorInit, ProcessorProvider, ProcessorSpec, StatefulProcessor,
};
use etlantic_core::plugin::ProcessorRegistration;
use etlantic_core::streaming::{Duration, TimeMode};
use etlantic_core::Result;
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::sync::Arc;

/// The provider of `session_summary`.
pub struct SessionSummaryProvider;

/// One open session of a key (the stored state).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Session {
    /// First event (epoch ms).
    start_ms: i64,
    /// Last event (epoch ms).
    last_ms: i64,
    /// Events in it.
    events: i64,
}

/// A `session_summary` processor of one `process` step.
pub struct SessionSummary {
    time_column: String,
    gap_ms: i64,
    ttl: Option<Duration>,
    schema: SchemaRef,
    sessions: Option<ListState<Session>>,
}

impl ProcessorProvider for SessionSummaryProvider {
    fn name(&self) -> &'static str {
        "session_summary"
    }

    fn description(&self) -> &'static str {
        "per-key sessions closed by an inactivity gap in event time (event-time timers, optional TTL)"
    }

    fn create(&self, spec: &ProcessorSpec) -> Result<Box<dyn StatefulProcessor>> {
        spec.expect_options("session_summary", &["time_column", "gap", "ttl"])?;
        if spec.time_mode != TimeMode::EventTime {
            return Err(invalid(
                "session_summary closes sessions on event-time timers: declare `time_mode: event_time`",
            ));
        }
        let time_column = spec
            .option_str("time_column")
            .ok_or_else(|| invalid("session_summary needs the option `time_column`"))?
            .to_string();
        let time_type = spec.column(&time_column)?.data_type().clone();
        if !matches!(time_type, DataType::Timestamp(..)) {
            return Err(invalid(format!(
                "session_summary: `{time_column}` is {time_type}, not a timestamp"
            )));
        }
        let gap = spec
            .option_duration("gap")?
            .filter(|g| g.as_millis() > 0)
            .ok_or_else(|| invalid("session_summary needs a positive `gap`"))?;
        let mut fields: Vec<Field> = spec
            .keys
            .iter()
            .map(|k| Ok(spec.column(k)?.clone().with_nullable(true)))
            .collect::<Result<_>>()?;
        for reserved in ["session_start", "session_end", "events"] {
            if spec.keys.iter().any(|k| k == reserved) {
                return Err(invalid(format!(
                    "session_summary: the key `{reserved}` collides with an output column"
                )));
            }
        }
        fields.push(Field::new("session_start", time_type.clone(), false));
        fields.push(Field::new("session_end", time_type, false));
        fields.push(Field::new("events", DataType::Int64, false));
        Ok(Box::new(SessionSummary {
            time_column,
            gap_ms: gap.as_millis(),
            ttl: spec.option_duration("ttl")?,
            schema: Arc::new(Schema::new(fields)),
            sessions: None,
        }))
    }
}

impl SessionSummary {
    fn handle(&self) -> ListState<Session> {
        self.sessions.expect("init declares the state")
    }

    /// One timer per open session, at its end.
    fn reset_timers(&self, sessions: &[Session], ctx: &mut ProcessorContext<'_>) -> Result<()> {
        for t in ctx.list_timers() {
            ctx.delete_timer(t);
        }
        for s in sessions {
            ctx.register_timer(s.last_ms + self.gap_ms)?;
        }
        Ok(())
    }
}

impl StatefulProcessor for SessionSummary {
    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn init(&mut self, init: &mut ProcessorInit) -> Result<()> {
        self.sessions = Some(init.list_state("sessions", self.ttl)?);
        Ok(())
    }

    fn handle_input_rows(
        &mut self,
        _key: &GroupKey,
        rows: &RecordBatch,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let state = self.handle();
        let mut times: Vec<i64> = timestamp_millis(rows, &self.time_column)?
            .into_iter()
            .flatten()
            .collect();
        if times.is_empty() {
            return Ok(());
        }
        times.sort_unstable();
        let mut sessions = state.get(ctx)?;
        for t in times {
            // [t, t + gap) merges with every session [start, last + gap) it overlaps or
            // touches.
            let mut merged = Session {
                start_ms: t,
                last_ms: t,
                events: 1,
            };
            sessions.retain(|s| {
                let touches = s.start_ms <= t + self.gap_ms && t <= s.last_ms + self.gap_ms;
                if touches {
                    merged.start_ms = merged.start_ms.min(s.start_ms);
                    merged.last_ms = merged.last_ms.max(s.last_ms);
                    merged.events += s.events;
                }
                !touches
            });
            sessions.push(merged);
            sessions.sort_by_key(|s| s.start_ms);
        }
        state.put(ctx, &sessions)?;
        self.reset_timers(&sessions, ctx)
    }

    fn handle_expired_timer(
        &mut self,
        key: &GroupKey,
        timer: ExpiredTimer,
        ctx: &mut ProcessorContext<'_>,
    ) -> Result<()> {
        let state = self.handle();
        // Sessions the TTL removed are gone: their timers find nothing.
        let (closed, open): (Vec<Session>, Vec<Session>) = state
            .get(ctx)?
            .into_iter()
            .partition(|s| s.last_ms + self.gap_ms <= timer.time_ms);
        for s in &closed {
            let mut row = key.values().clone();
            row.insert("session_start".into(), json!(iso_millis(s.start_ms)));
            row.insert(
                "session_end".into(),
                json!(iso_millis(s.last_ms + self.gap_ms)),
            );
            row.insert("events".into(), json!(s.events));
            ctx.emit(&row)?;
        }
        if !closed.is_empty() {
            state.put(ctx, &open)?;
        }
        Ok(())
    }
}

etlantic_core::inventory::submit! { ProcessorRegistration(&SessionSummaryProvider) }

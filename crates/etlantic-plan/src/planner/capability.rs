//! The capability phase: whether the bound sources, sinks and backends can run the
//! pipeline in its execution mode, including a streaming pipeline that a backend runs
//! as one query of its own.

use super::Planner;
use etlantic_core::diagnostics::{codes, Diagnostic};
use etlantic_core::plugin;
use etlantic_core::streaming::ExecutionMode;

impl Planner<'_> {
    pub(super) fn capability(&mut self) {
        let pl = self.p.pipeline.clone();
        let mode = self.p.profile.mode;
        if let (
            ExecutionMode::Streaming,
            Some(etlantic_core::streaming::Trigger::Continuous(interval)),
        ) = (mode, self.p.profile.trigger)
        {
            let continuous = self
                .backend_of
                .values()
                .all(|b| b.capabilities().continuous)
                && !self.backend_of.is_empty();
            if !continuous {
                self.push(
                    Diagnostic::new(
                        &codes::CONTINUOUS_FALLBACK,
                        format!("the continuous trigger is not supported here; falling back to `processing_time {interval}` micro-batches"),
                    )
                    .at("trigger")
                    .in_file(self.p.profile_file.clone().unwrap_or_default()),
                );
            }
        }
        for s in &pl.sources {
            let Some(uri) = self.bindings.get(&s.asset) else {
                continue;
            };
            let provider =
                plugin::source_provider(&uri.scheme).expect("checked in the reference phase");
            match provider.capabilities(uri) {
                Ok(c) => {
                    let ok = match mode {
                        ExecutionMode::Batch => c.bounded,
                        ExecutionMode::Streaming if s.is_static() => c.bounded,
                        ExecutionMode::Streaming => c.unbounded,
                    };
                    if !ok && s.is_static() {
                        self.push(
                            Diagnostic::new(
                                &codes::STATIC_SOURCE_UNBOUNDED,
                                format!(
                                    "static source `{}` ({}) cannot be read as a bounded table",
                                    s.id,
                                    uri.redacted()
                                ),
                            )
                            .at(format!("sources[{}].static_refresh", s.id)),
                        );
                    } else if !ok {
                        self.push(
                            Diagnostic::new(
                                &codes::SOURCE_NOT_STREAMABLE,
                                format!(
                                    "source `{}` ({}) cannot be read in a {} run",
                                    s.id,
                                    uri.redacted(),
                                    if mode == ExecutionMode::Batch {
                                        "batch"
                                    } else {
                                        "streaming"
                                    }
                                ),
                            )
                            .at(format!("sources[{}]", s.id)),
                        );
                    }
                }
                Err(e) => self.extend(e, &format!("sources[{}]", s.id)),
            }
        }
        for s in &pl.sinks {
            let Some(uri) = self.bindings.get(&s.asset) else {
                continue;
            };
            let provider =
                plugin::sink_provider(&uri.scheme).expect("checked in the reference phase");
            match provider.capabilities(uri) {
                Ok(c) => {
                    let mode_ok = match mode {
                        ExecutionMode::Batch => c.batch,
                        ExecutionMode::Streaming => c.streaming,
                    };
                    let om = s.output_mode.unwrap_or_default();
                    if !mode_ok
                        || (mode == ExecutionMode::Streaming && !c.output_modes.contains(&om))
                    {
                        self.push(
                            Diagnostic::new(
                                &codes::SINK_MODE_UNSUPPORTED,
                                format!("sink `{}` ({}) does not support this run (mode {:?}, output mode {})", s.id, uri.redacted(), mode, om.as_str()),
                            )
                            .at(format!("sinks[{}]", s.id)),
                        );
                    }
                }
                Err(e) => self.extend(e, &format!("sinks[{}]", s.id)),
            }
        }
        self.region_locations();
        self.in_place_sources();
        if mode == ExecutionMode::Streaming {
            self.allowed_lateness();
            self.whole_query_streaming();
        }
    }

    /// A window with allowed lateness on a stream runs only on a backend that keeps
    /// windows open for it; anywhere else it would silently close at the watermark.
    fn allowed_lateness(&mut self) {
        let plans = self.logic_plans();
        let mut found = Vec::new();
        for id in &self.order {
            let (Some(backend), Some(plan)) = (self.backend_of.get(id), plans.get(id)) else {
                continue;
            };
            if backend.capabilities().streaming.allowed_lateness {
                continue;
            }
            for step in &plan.decoded().steps {
                if let etlantic_core::ir::Action::WindowAggregate { window, .. } = &step.op {
                    if window.allowed_lateness > etlantic_core::streaming::Duration::ZERO {
                        found.push(
                            Diagnostic::new(
                                &codes::BACKEND_UNSUPPORTED_ACTION,
                                format!(
                                    "the window of `{id}` allows {} of lateness, but `{}` closes a streaming window when the watermark passes its end",
                                    window.allowed_lateness,
                                    backend.name()
                                ),
                            )
                            .at(format!("transforms[{id}].steps[{}]", step.id))
                            .help("Run this transformation on `datafusion` (the embedded runtime keeps windows open for their lateness), or remove `allowed_lateness`."),
                        );
                    }
                }
            }
        }
        for d in found {
            self.push(d);
        }
    }

    /// A streaming pipeline with a step on a backend that runs whole queries in another
    /// system (Spark) runs there as one query: that backend reads the sources and writes
    /// the sinks itself, so every step must be on it, and it must give what the
    /// pipeline asks of the runtime (late policies, quarantine, contract rules).
    /// Anything else is `ETL507`. (The embedded runtime gives all of it.)
    fn whole_query_streaming(&mut self) {
        let Some((first, backend)) = self.order.iter().find_map(|id| {
            let b = self.backend_of.get(id)?;
            b.capabilities()
                .streaming
                .whole_query
                .then(|| (id.clone(), *b))
        }) else {
            return;
        };
        let name = backend.name();
        let support = backend.capabilities().streaming;
        let unsupported = |message: String, at: String, help: String| {
            Diagnostic::new(&codes::STREAMING_REGION_UNSUPPORTED, message)
                .at(at)
                .help(help)
        };
        let mut found = Vec::new();
        for id in &self.order {
            let b = self.backend_of[id].name();
            if b != name {
                found.push(unsupported(
                    format!("`{first}` runs on `{name}`, which runs a streaming pipeline as one query of its own, but `{id}` runs on `{b}`"),
                    format!("engines.{id}"),
                    format!("Place every transformation on `{name}` (`engines: {{{id}: {name}}}`), or none."),
                ));
            }
        }
        let pl = self.p.pipeline.clone();
        let io = |kind: &str, id: &str, asset: &str| -> Option<Diagnostic> {
            let uri = self.bindings.get(asset)?;
            (!support.io_schemes.contains(&uri.scheme)).then(|| {
                unsupported(
                    format!("{kind} `{id}` is bound to `{}`, which a streaming query on `{name}` does not {}", uri.redacted(), if kind == "source" { "read" } else { "write" }),
                    format!("{kind}s[{id}]"),
                    format!("Bind it to one of: {}.", support.io_schemes.iter().map(|s| format!("{s}://")).collect::<Vec<_>>().join(", ")),
                )
            })
        };
        for s in &pl.sources {
            found.extend(io("source", &s.id, &s.asset));
            let policy = s.late_events.name();
            if !support.late_policies.iter().any(|p| p == policy) {
                found.push(unsupported(
                    format!(
                        "source `{}` sends late events to `{policy}`, which `{name}` does not do",
                        s.id
                    ),
                    format!("sources[{}].late_events", s.id),
                    format!("`{name}` applies: {}.", support.late_policies.join(", ")),
                ));
            }
        }
        for s in &pl.sinks {
            found.extend(io("sink", &s.id, &s.asset));
        }
        if !support.quarantine {
            if self.p.profile.on_error == etlantic_core::profile::OnError::Quarantine {
                found.push(unsupported(
                    format!("bad records are to be quarantined (`on_error: quarantine`), which a streaming query on `{name}` cannot do"),
                    "on_error".into(),
                    "Set `on_error: fail`: the query then stops at the first malformed record or missing required field.".into(),
                ));
            }
            for (asset, c) in &self.contracts {
                let rules = etlantic_core::contract::rules::RuleSet::of(c)
                    .map(|set| set.rules.len())
                    .unwrap_or(0);
                if rules > 0 {
                    found.push(unsupported(
                        format!("the contract of `{asset}` has {rules} quality rule(s), which a streaming query on `{name}` does not evaluate"),
                        format!("assets[{asset}]"),
                        "Run the pipeline on the embedded runtime, or check the rules downstream.".into(),
                    ));
                }
            }
        }
        for d in found {
            self.push(d);
        }
    }
}

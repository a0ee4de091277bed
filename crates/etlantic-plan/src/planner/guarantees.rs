//! The guarantee phase: the end-to-end delivery guarantee of every source-to-sink pair,
//! checked against what the profile requires, and replayability where state
//! checkpoints need it.

use super::{source_guarantee, Planner};
use crate::plan::PairGuarantee;
use etlantic_core::diagnostics::{codes, Diagnostic};
use etlantic_core::guarantee::{end_to_end, SourceGuarantee};
use etlantic_core::plugin;
use etlantic_core::streaming::ExecutionMode;

impl Planner<'_> {
    fn upstream_sources(&self, node: &str, out: &mut Vec<String>) {
        if self.p.pipeline.source(node).is_some() {
            if !out.iter().any(|x| x == node) {
                out.push(node.to_string());
            }
            return;
        }
        if let Some(t) = self.p.pipeline.transform(node) {
            for r in t.inputs.values() {
                self.upstream_sources(r.from(), out);
            }
        }
    }

    pub(super) fn guarantees(&mut self) -> Vec<PairGuarantee> {
        let pl = self.p.pipeline.clone();
        let mut out = Vec::new();
        // A state checkpoint interval rebuilds state by reading committed micro-batches
        // again: every stream must be replayable.
        if self.p.profile.mode == ExecutionMode::Streaming
            && self.p.profile.state_checkpoint_interval.is_some()
        {
            for s in pl.sources.iter().filter(|s| s.static_refresh.is_none()) {
                let Some(uri) = self.bindings.get(&s.asset) else {
                    continue;
                };
                if source_guarantee(uri) != SourceGuarantee::Replayable {
                    self.push(
                        Diagnostic::new(
                            &codes::STATE_INTERVAL_NEEDS_REPLAY,
                            format!(
                                "source `{}` ({}) cannot be read again, and `state_checkpoint_interval` needs to read committed micro-batches again after a restart",
                                s.id, uri.scheme
                            ),
                        )
                        .at(format!("sources[{}]", s.id)),
                    );
                }
            }
        }
        for sink in &pl.sinks {
            let Some(uri) = self.bindings.get(&sink.asset) else {
                continue;
            };
            let Ok(sc) = plugin::sink_provider(&uri.scheme)
                .expect("checked")
                .capabilities(uri)
            else {
                continue;
            };
            let mut sources = Vec::new();
            self.upstream_sources(&sink.input, &mut sources);
            for src in sources {
                let s = pl.source(&src).expect("exists");
                let Some(su) = self.bindings.get(&s.asset) else {
                    continue;
                };
                let Ok(srcc) = plugin::source_provider(&su.scheme)
                    .expect("checked")
                    .capabilities(su)
                else {
                    continue;
                };
                let g = end_to_end(srcc.guarantee, sc.guarantee.protocol);
                if let Some(req) = self.p.profile.require_guarantee {
                    if g < req {
                        self.push(
                            Diagnostic::new(
                                &codes::GUARANTEE_UNMET,
                                format!(
                                    "the profile requires {req} but `{src}` → `{}` gives {g} ({:?} source, {:?} sink)",
                                    sink.id, srcc.guarantee, sc.guarantee.protocol
                                ),
                            )
                            .at(format!("sinks[{}]", sink.id)),
                        );
                    }
                }
                out.push(PairGuarantee {
                    source: src.clone(),
                    sink: sink.id.clone(),
                    guarantee: g,
                    condition: sc.guarantee.condition.clone(),
                });
            }
        }
        out
    }
}

//! The structural phase: node ids, implementation counts, edges into sinks, cycles
//! among transformations, and nodes that feed nothing. It also fixes the execution
//! order of the transformations that every later phase follows.

use super::Planner;
use etlantic_core::diagnostics::{codes, Diagnostic};
use etlantic_core::model::TransformDef;
use std::collections::{HashMap, HashSet};

fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

impl Planner<'_> {
    pub(super) fn structural(&mut self) {
        let pl = &self.p.pipeline;
        let mut seen: HashSet<&str> = HashSet::new();
        let mut found = Vec::new();
        let nodes = pl
            .sources
            .iter()
            .map(|s| ("sources", s.id.as_str()))
            .chain(pl.transforms.iter().map(|t| ("transforms", t.id.as_str())))
            .chain(pl.sinks.iter().map(|s| ("sinks", s.id.as_str())));
        for (section, id) in nodes {
            if !valid_id(id) {
                found.push(
                    Diagnostic::new(&codes::INVALID_ID, format!("invalid id `{id}`"))
                        .at(format!("{section}[{id}]")),
                );
            } else if !seen.insert(id) {
                found.push(
                    Diagnostic::new(
                        &codes::DUPLICATE_ID,
                        format!("id `{id}` is used by more than one node"),
                    )
                    .at(format!("{section}[{id}]")),
                );
            }
        }
        if pl.sources.is_empty() || pl.sinks.is_empty() {
            found.push(
                Diagnostic::new(
                    &codes::EMPTY_PIPELINE,
                    format!(
                        "the pipeline has {} source(s) and {} sink(s)",
                        pl.sources.len(),
                        pl.sinks.len()
                    ),
                )
                .at("pipeline"),
            );
        }
        for t in &pl.transforms {
            let count = [
                t.steps.is_some(),
                t.plan.is_some(),
                t.sql.is_some(),
                t.implementation.is_some(),
            ]
            .iter()
            .filter(|b| **b)
            .count();
            if count != 1 {
                found.push(
                    Diagnostic::new(
                        &codes::IMPLEMENTATION_COUNT,
                        format!("transformation `{}` has {count} implementations", t.id),
                    )
                    .at(format!("transforms[{}]", t.id)),
                );
            }
            if t.inputs.is_empty() {
                found.push(
                    Diagnostic::new(
                        &codes::PORT_UNCONNECTED,
                        format!("transformation `{}` has no input port", t.id),
                    )
                    .at(format!("transforms[{}].inputs", t.id)),
                );
            }
        }
        for s in &pl.sinks {
            if pl.sinks.iter().any(|x| x.id == s.input) {
                found.push(
                    Diagnostic::new(
                        &codes::SINK_AS_INPUT,
                        format!("sink `{}` reads from sink `{}`", s.id, s.input),
                    )
                    .at(format!("sinks[{}].input", s.id)),
                );
            }
        }
        for t in &pl.transforms {
            for (port, r) in &t.inputs {
                if pl.sinks.iter().any(|x| x.id == r.from()) {
                    found.push(
                        Diagnostic::new(
                            &codes::SINK_AS_INPUT,
                            format!("port `{port}` of `{}` reads from sink `{}`", t.id, r.from()),
                        )
                        .at(format!("transforms[{}].inputs.{port}", t.id)),
                    );
                }
            }
        }
        // Cycles among transformations (edges to unknown nodes are the reference
        // phase's business).
        let ids: HashMap<&str, &TransformDef> =
            pl.transforms.iter().map(|t| (t.id.as_str(), t)).collect();
        let mut state: HashMap<&str, u8> = HashMap::new(); // 1 = on stack, 2 = done
        let mut order = Vec::new();
        fn visit<'b>(
            id: &'b str,
            ids: &HashMap<&'b str, &'b TransformDef>,
            state: &mut HashMap<&'b str, u8>,
            stack: &mut Vec<&'b str>,
            order: &mut Vec<String>,
            cycles: &mut Vec<Vec<String>>,
        ) {
            match state.get(id) {
                Some(2) => return,
                Some(1) => {
                    let start = stack.iter().position(|x| *x == id).unwrap_or(0);
                    let mut c: Vec<String> = stack[start..].iter().map(|s| s.to_string()).collect();
                    c.push(id.to_string());
                    cycles.push(c);
                    return;
                }
                _ => {}
            }
            state.insert(id, 1);
            stack.push(id);
            if let Some(t) = ids.get(id) {
                for r in t.inputs.values() {
                    if ids.contains_key(r.from()) {
                        visit(r.from(), ids, state, stack, order, cycles);
                    }
                }
            }
            stack.pop();
            state.insert(id, 2);
            order.push(id.to_string());
        }
        let mut cycles = Vec::new();
        for t in &pl.transforms {
            let mut stack = Vec::new();
            visit(&t.id, &ids, &mut state, &mut stack, &mut order, &mut cycles);
        }
        for c in cycles {
            found.push(
                Diagnostic::new(&codes::CYCLE, format!("cycle: {}", c.join(" -> ")))
                    .at(format!("transforms[{}].inputs", c[0]))
                    .help("A pipeline is a directed acyclic graph; remove one of these edges."),
            );
        }
        self.order = order;
        // Unused nodes (warnings).
        let used: HashSet<&str> = pl
            .transforms
            .iter()
            .flat_map(|t| t.inputs.values().map(|r| r.from()))
            .chain(pl.sinks.iter().map(|s| s.input.as_str()))
            .collect();
        for s in &pl.sources {
            if !used.contains(s.id.as_str()) {
                found.push(
                    Diagnostic::new(
                        &codes::UNUSED_NODE,
                        format!("source `{}` feeds nothing", s.id),
                    )
                    .at(format!("sources[{}]", s.id)),
                );
            }
        }
        for t in &pl.transforms {
            if !used.contains(t.id.as_str()) {
                found.push(
                    Diagnostic::new(
                        &codes::UNUSED_NODE,
                        format!("transformation `{}` feeds nothing", t.id),
                    )
                    .at(format!("transforms[{}]", t.id)),
                );
            }
        }
        for d in found {
            self.push(d);
        }
    }
}

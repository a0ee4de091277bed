//! `explain`: a PipelinePlan as text for people and as a Mermaid flowchart.

use crate::plan::{PipelinePlan, PlanLogic};
use etlantic_core::ir::{Action, TransformPlan};
use std::fmt::Write;

fn summarize_logic(logic: &PlanLogic) -> String {
    match logic {
        PlanLogic::Portable { plan, output, .. } => match TransformPlan::from_value(plan, "plan") {
            Ok(tp) => {
                let steps: Vec<String> =
                    tp.decoded().steps.iter().map(|s| describe(&s.op)).collect();
                format!(
                    "DTCS plan → {output}: {}",
                    if steps.is_empty() {
                        "(pass-through)".into()
                    } else {
                        steps.join(" → ")
                    }
                )
            }
            Err(_) => "DTCS plan (unreadable)".into(),
        },
        PlanLogic::Sql { engine, query } => format!(
            "SQL on {engine}: {}",
            query.split_whitespace().collect::<Vec<_>>().join(" ")
        ),
        PlanLogic::Impl { name } => format!("implementation `{name}`"),
    }
}

fn describe(a: &Action) -> String {
    match a {
        Action::Filter { predicate } => format!("filter {predicate}"),
        Action::Project { fields } => format!(
            "project [{}]",
            fields
                .iter()
                .map(|f| f.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Action::WithFields { assignments } => format!(
            "with [{}]",
            assignments
                .iter()
                .map(|f| format!("{} = {}", f.name, f.expr))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Action::WindowFields { assignments } => format!(
            "window [{}]",
            assignments
                .iter()
                .map(|a| {
                    let by = |v: Vec<String>, what: &str| {
                        if v.is_empty() {
                            String::new()
                        } else {
                            format!(" {what} {}", v.join(", "))
                        }
                    };
                    format!(
                        "{} = {} over ({}{})",
                        a.name,
                        a.call,
                        by(
                            a.partition_by.iter().map(|p| p.to_string()).collect(),
                            "partition by"
                        )
                        .trim_start(),
                        by(
                            a.order_by
                                .iter()
                                .map(|k| format!(
                                    "{}{}",
                                    k.expr,
                                    if k.descending { " desc" } else { "" }
                                ))
                                .collect(),
                            "order by"
                        )
                    )
                })
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Action::DropFields { fields, .. } => format!("drop [{}]", fields.join(", ")),
        Action::RenameFields { mapping } => format!(
            "rename [{}]",
            mapping
                .iter()
                .map(|(a, b)| format!("{a}→{b}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Action::Join {
            right,
            join_type,
            left_keys,
            time_range,
            ..
        } => {
            let mut s = format!(
                "{} join {right} on [{}]",
                join_type.name(),
                left_keys.join(", ")
            );
            if let Some(r) = time_range {
                s.push_str(&format!(
                    " and {} between {right}.{} - {} and + {}",
                    r.left, r.right, r.lower, r.upper
                ));
            }
            s
        }
        Action::Union { other, .. } => format!("union {other}"),
        Action::Aggregate {
            group_by,
            aggregates,
        } => format!(
            "aggregate by [{}]: [{}]",
            group_by
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            aggregates
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Action::WindowAggregate {
            window,
            group_by,
            aggregates,
        } => format!(
            "{} by [{}]: [{}]",
            window_text(window),
            group_by
                .iter()
                .map(|g| g.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            aggregates
                .iter()
                .map(|a| a.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Action::Sort { keys } => format!(
            "sort [{}]",
            keys.iter()
                .map(|k| format!("{}{}", k.expr, if k.descending { " desc" } else { "" }))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Action::Limit { count, offset } => format!("limit {count} offset {offset}"),
        Action::Distinct { .. } => "distinct".into(),
        Action::Deduplicate { keys, .. } => format!("deduplicate [{}]", keys.join(", ")),
        Action::Explode { column, alias, .. } => format!("explode {column} as {alias}"),
        Action::DeduplicateWithinWatermark { keys } => {
            format!("deduplicate within watermark [{}]", keys.join(", "))
        }
        Action::Process {
            processor,
            keys,
            time_mode,
            ..
        } => format!(
            "process `{processor}` by [{}] ({} timers)",
            keys.join(", "),
            time_mode.as_str()
        ),
    }
}

/// The plan as text.
pub fn explain_text(plan: &PipelinePlan) -> String {
    let mut o = String::new();
    let p = &plan.profile;
    let _ = writeln!(
        o,
        "Pipeline {} (profile {}, {:?} mode)",
        plan.pipeline, p.name, p.mode
    );
    let _ = writeln!(o, "Fingerprint {}", plan.fingerprint);
    if let Some(t) = &p.trigger {
        let _ = writeln!(o, "Trigger {t}");
    }
    if let Some(c) = &p.checkpoint {
        let _ = writeln!(o, "Checkpoint {c}");
    }
    for (op, ttl) in &p.state_ttl {
        let _ = writeln!(o, "State TTL {op}: {ttl}");
    }
    let _ = writeln!(o, "Bad records: {:?} → {}", p.on_error, p.quarantine);
    let _ = writeln!(o, "\nSources");
    for s in &plan.sources {
        let a = &plan.assets[&s.asset];
        let _ = write!(
            o,
            "  {} ← asset {} ({}) [{:?}]",
            s.id,
            s.asset,
            etlantic_core::uri::redact(&a.binding),
            s.guarantee
        );
        if let Some(et) = &s.event_time {
            let _ = write!(o, " event_time {}", et.column);
        }
        if let Some(w) = &s.watermark {
            let _ = write!(o, " watermark {w} late {:?}", s.late_events);
        }
        let _ = writeln!(o);
        if let (Some(_), Some(et)) = (&s.watermark, &s.event_time) {
            let _ = writeln!(
                o,
                "    watermark measured on {}",
                measured_rows(s, &et.column)
            );
        }
    }
    let _ = writeln!(o, "\nRegions");
    for r in &plan.regions {
        let place = match &r.location {
            Some(l) => format!(" in {}", etlantic_core::uri::redact(l)),
            None => String::new(),
        };
        let _ = writeln!(
            o,
            "  {} ({:?} on {}{place}): reads [{}], hands on [{}]",
            r.id,
            r.kind,
            r.backend,
            r.inputs.join(", "),
            r.outputs.join(", ")
        );
        for id in &r.steps {
            let t = plan.transform(id).expect("region steps exist");
            let _ = writeln!(
                o,
                "    {} ({}) = {}",
                t.id,
                t.inputs
                    .iter()
                    .map(|(p, f)| format!("{p}←{f}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                summarize_logic(&t.logic)
            );
            let _ = writeln!(
                o,
                "      schema: {}",
                t.schema
                    .iter()
                    .map(|f| format!(
                        "{}: {}{}",
                        f.name,
                        f.data_type,
                        if f.nullable { "?" } else { "" }
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let _ = writeln!(o, "\nSinks");
    for s in &plan.sinks {
        let a = &plan.assets[&s.asset];
        let _ = writeln!(
            o,
            "  {} ← {} → asset {} ({}) [{:?}] output {:?}, write {:?}",
            s.id,
            s.input,
            s.asset,
            etlantic_core::uri::redact(&a.binding),
            s.guarantee.protocol,
            s.output_mode,
            s.write_mode
        );
    }
    quality_section(plan, &mut o);
    let _ = writeln!(o, "\nTransitions");
    for t in &plan.transitions {
        let _ = writeln!(
            o,
            "  {} → {}: {} ({})",
            t.from, t.to, t.relation, t.materialization
        );
    }
    let _ = writeln!(o, "\nDelivery guarantees");
    for g in &plan.guarantees {
        let _ = write!(o, "  {} → {}: {}", g.source, g.sink, g.guarantee);
        if let Some(c) = &g.condition {
            let _ = write!(o, " ({c})");
        }
        let _ = writeln!(o);
    }
    if !plan.warnings.is_empty() {
        let _ = writeln!(o, "\nWarnings");
        for w in plan.warnings.iter() {
            let _ = writeln!(o, "  {w}");
        }
    }
    o
}

/// Every quality rule of the source and sink contracts: where it is evaluated, in what
/// scope, and the policy in force; rules ETLantic cannot evaluate are listed as such.
fn quality_section(plan: &PipelinePlan, o: &mut String) {
    use etlantic_core::contract::rules::{RuleSet, Scope};
    let streaming = plan.profile.mode == etlantic_core::streaming::ExecutionMode::Streaming;
    let on_error = plan.profile.on_error.as_policy();
    let crossings = plan
        .sources
        .iter()
        .map(|s| ("source", &s.id, &s.asset))
        .chain(plan.sinks.iter().map(|s| ("sink", &s.id, &s.asset)));
    let mut lines = Vec::new();
    for (kind, id, asset) in crossings {
        let Ok(contract) = plan.asset_contract(asset) else {
            continue;
        };
        let Ok(set) = RuleSet::of(&contract) else {
            continue;
        };
        if set.rules.is_empty() && set.unevaluated.is_empty() {
            continue;
        }
        lines.push(format!("  {kind} {id} (asset {asset})"));
        for r in &set.rules {
            let policy = r.policy(plan.profile.quality_policies.get(&r.id).copied(), on_error);
            let at = match (kind, r.scope()) {
                ("source", Scope::Record) => "each record, while the source decodes it",
                ("source", _) if streaming => "each micro-batch, after the source reads it",
                ("source", _) => "the whole input, after the source reads it",
                (_, Scope::Record) => "each record, before the sink publishes it",
                _ if streaming => "each micro-batch, before the sink publishes it",
                _ => "the whole output, before the sink publishes it",
            };
            lines.push(format!(
                "    {} ({}) → {}: on {at} (embedded engine)",
                r.id,
                r.check.name(),
                policy.as_str()
            ));
        }
        for u in &set.unevaluated {
            lines.push(format!(
                "    {}: NOT EVALUATED — {} (ETL223)",
                u.id, u.reason
            ));
        }
    }
    if !lines.is_empty() {
        let _ = writeln!(o, "\nQuality rules");
        for l in lines {
            let _ = writeln!(o, "{l}");
        }
    }
}

fn node_id(kind: &str, id: &str) -> String {
    format!(
        "{kind}_{}",
        id.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    )
}

fn label(s: &str) -> String {
    s.replace('"', "'")
}

/// Which rows of source `s` (event-time column `column`) its watermark is measured on.
fn measured_rows(s: &crate::plan::PlanSource, column: &str) -> String {
    match s
        .watermark_rows
        .as_ref()
        .map(etlantic_core::ir::Expr::decode)
    {
        None => format!("max({column}) of every row read"),
        Some(Ok(e)) => format!(
            "max({column}) of the rows where {e} (filters moved below the watermark, as Spark's optimizer does)"
        ),
        Some(Err(m)) => format!("an unreadable predicate ({m})"),
    }
}

/// The plan as a Mermaid flowchart: sources, one subgraph per region, sinks, and every
/// transition as an edge.
pub fn explain_mermaid(plan: &PipelinePlan) -> String {
    let mut o = String::from("flowchart LR\n");
    for s in &plan.sources {
        let measured = match (&s.watermark_rows, &s.event_time) {
            (Some(_), Some(et)) => {
                format!("<br/>watermark: {}", label(&measured_rows(s, &et.column)))
            }
            _ => String::new(),
        };
        let _ = writeln!(
            o,
            "  {}[(\"{}<br/>{}{measured}\")]",
            node_id("src", &s.id),
            label(&s.id),
            label(&s.asset)
        );
    }
    for r in &plan.regions {
        let _ = writeln!(
            o,
            "  subgraph {}[\"{}: {:?} on {}\"]",
            node_id("region", &r.id),
            r.id,
            r.kind,
            r.backend
        );
        for id in &r.steps {
            let _ = writeln!(o, "    {}[\"{}\"]", node_id("t", id), label(id));
        }
        let _ = writeln!(o, "  end");
    }
    for s in &plan.sinks {
        let _ = writeln!(
            o,
            "  {}[/\"{}<br/>{}\"/]",
            node_id("sink", &s.id),
            label(&s.id),
            label(&s.asset)
        );
    }
    let place = |node: &str| -> String {
        if plan.source(node).is_some() {
            node_id("src", node)
        } else {
            node_id("t", node)
        }
    };
    for t in &plan.transforms {
        for from in t.inputs.values() {
            let crosses = plan
                .transform(from)
                .map(|f| f.region != t.region)
                .unwrap_or(true);
            let _ = writeln!(
                o,
                "  {} -->{} {}",
                place(from),
                if crosses { "|arrow|" } else { "" },
                node_id("t", &t.id)
            );
        }
    }
    for s in &plan.sinks {
        let _ = writeln!(
            o,
            "  {} -->|arrow| {}",
            place(&s.input),
            node_id("sink", &s.id)
        );
    }
    o
}

/// A window as `explain` shows it: `tumbling 10 seconds window on ts`, with its allowed
/// lateness when it has one.
fn window_text(window: &etlantic_core::ir::WindowSpec) -> String {
    use etlantic_core::ir::WindowKind;
    let geometry = match &window.kind {
        WindowKind::Tumbling { size } => format!("tumbling {size}"),
        WindowKind::Sliding { size, slide } => format!("sliding {size} every {slide}"),
        WindowKind::Session { gap } => format!("session (gap {gap})"),
    };
    let mut text = format!("{geometry} window on {}", window.time_column);
    if window.allowed_lateness > etlantic_core::streaming::Duration::ZERO {
        text.push_str(&format!(", allowed lateness {}", window.allowed_lateness));
    }
    text
}

//! DTCS actions (and ETLantic's `etlantic:` extensions) as DataFusion operations.
//!
//! Each function takes the relation the action targets (plus the secondary relation of a
//! join or union) and the [`Demand`] on its result's row order, and returns the result.

mod aggregate;
mod columns;
mod explode;
pub(crate) mod join;
mod ordering;
mod union;
mod window;
mod window_functions;

use crate::error;
use crate::plan::order::Demand;
use crate::relation::Relation;
use etlantic_core::ir::Action;
use etlantic_core::Result;

/// Applies one action.
pub(crate) fn apply(
    action: &Action,
    target: Relation,
    secondary: Option<Relation>,
    demand: Demand,
) -> Result<Relation> {
    let need_secondary = || {
        secondary
            .clone()
            .ok_or_else(|| error::engine("internal: the secondary relation is missing"))
    };
    match action {
        Action::Filter { predicate } => columns::filter(target, predicate, demand),
        Action::Project { fields } => columns::project(target, fields, demand),
        Action::WithFields { assignments } => columns::with_fields(target, assignments, demand),
        Action::WindowFields { assignments } => {
            window_functions::window_fields(target, assignments, demand)
        }
        Action::DropFields {
            fields,
            ignore_missing,
        } => columns::drop_fields(target, fields, *ignore_missing, demand),
        Action::RenameFields { mapping } => columns::rename_fields(target, mapping, demand),
        Action::Join { .. } => join::join(target, need_secondary()?, action, demand),
        Action::Union {
            by_name,
            allow_missing,
            distinct,
            ..
        } => union::union(
            target,
            need_secondary()?,
            *by_name,
            *allow_missing,
            *distinct,
            demand,
        ),
        Action::Aggregate {
            group_by,
            aggregates,
        } => aggregate::aggregate(target, group_by, aggregates, demand),
        Action::Sort { keys } => ordering::sort(target, keys, demand),
        Action::Limit { count, offset } => ordering::limit(target, *count, *offset, demand),
        Action::Distinct { fields } => match fields {
            None => ordering::distinct_rows(target, demand),
            Some(f) => ordering::first_per_key(target, f, false, demand),
        },
        Action::Deduplicate { keys, keep_last } => {
            if keys.is_empty() {
                ordering::distinct_rows(target, demand)
            } else {
                ordering::first_per_key(target, keys, *keep_last, demand)
            }
        }
        // In batch mode every event is within the watermark: the first row per key wins.
        Action::DeduplicateWithinWatermark { keys } => {
            if keys.is_empty() {
                ordering::distinct_rows(target, demand)
            } else {
                ordering::first_per_key(target, keys, false, demand)
            }
        }
        // Run in stages by `crate::staged`, never compiled into a data frame.
        Action::Process { processor, .. } => Err(error::unsupported(format!(
            "the processor step `{processor}` runs staged, not inside a compiled plan"
        ))),
        Action::Explode {
            column,
            alias,
            outer,
        } => explode::explode(target, column, alias, *outer, demand),
        Action::WindowAggregate {
            window,
            group_by,
            aggregates,
        } => window::window_aggregate(target, window, group_by, aggregates, demand),
    }
}

/// Fails when two output columns would get the same name.
pub(crate) fn unique_names<'a>(names: impl IntoIterator<Item = &'a str>, what: &str) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    for n in names {
        if crate::table::is_reserved(n) {
            return Err(error::invalid_plan(format!(
                "{what}: the column name `{n}` is reserved by the DataFusion backend"
            )));
        }
        if !seen.insert(n) {
            return Err(error::invalid_plan(format!(
                "{what}: two output columns are named `{n}`"
            )));
        }
    }
    Ok(())
}

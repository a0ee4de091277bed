//! Runtime parameters: `Expr::Parameter` references replaced by their values.

use etlantic_core::diagnostics::{codes, Diagnostic};
use etlantic_core::ir::{Action, Aggregate, Expr, NamedExpr, SortKey};
use etlantic_core::Result;
use indexmap::IndexMap;
use serde_json::Value;

fn bind(e: &Expr, params: &IndexMap<String, Value>) -> Result<Expr> {
    e.bind_parameters(params).map_err(|m| {
        Diagnostic::new(&codes::UNKNOWN_PARAMETER, m)
            .help("Give the value under `parameters:` of the transformation.")
            .into()
    })
}

fn named(items: &[NamedExpr], params: &IndexMap<String, Value>) -> Result<Vec<NamedExpr>> {
    items
        .iter()
        .map(|n| {
            Ok(NamedExpr {
                name: n.name.clone(),
                expr: bind(&n.expr, params)?,
            })
        })
        .collect()
}

fn aggregates(items: &[Aggregate], params: &IndexMap<String, Value>) -> Result<Vec<Aggregate>> {
    items
        .iter()
        .map(|a| {
            Ok(Aggregate {
                name: a.name.clone(),
                func: a.func,
                arg: a.arg.as_ref().map(|e| bind(e, params)).transpose()?,
            })
        })
        .collect()
}

/// The action with every parameter reference replaced by its value (`ETL209` when a
/// value is missing).
pub(crate) fn bind_action(action: &Action, params: &IndexMap<String, Value>) -> Result<Action> {
    Ok(match action {
        Action::Filter { predicate } => Action::Filter {
            predicate: bind(predicate, params)?,
        },
        Action::Project { fields } => Action::Project {
            fields: named(fields, params)?,
        },
        Action::WithFields { assignments } => Action::WithFields {
            assignments: named(assignments, params)?,
        },
        Action::Join {
            right,
            join_type,
            left_keys,
            right_keys,
            predicate,
            null_safe,
            time_range,
        } => Action::Join {
            right: right.clone(),
            join_type: *join_type,
            left_keys: left_keys.clone(),
            right_keys: right_keys.clone(),
            predicate: predicate.as_ref().map(|p| bind(p, params)).transpose()?,
            null_safe: *null_safe,
            time_range: time_range.clone(),
        },
        Action::Aggregate {
            group_by,
            aggregates: aggs,
        } => Action::Aggregate {
            group_by: named(group_by, params)?,
            aggregates: aggregates(aggs, params)?,
        },
        Action::WindowAggregate {
            window,
            group_by,
            aggregates: aggs,
        } => Action::WindowAggregate {
            window: window.clone(),
            group_by: named(group_by, params)?,
            aggregates: aggregates(aggs, params)?,
        },
        Action::Sort { keys } => Action::Sort {
            keys: keys
                .iter()
                .map(|k| {
                    Ok(SortKey {
                        expr: bind(&k.expr, params)?,
                        descending: k.descending,
                        nulls_first: k.nulls_first,
                    })
                })
                .collect::<Result<_>>()?,
        },
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use etlantic_core::ir::Literal;
    use serde_json::json;

    #[test]
    fn binds_and_reports_missing_values() {
        let a = Action::Filter {
            predicate: Expr::Binary(
                etlantic_core::ir::BinaryOp::GtEq,
                Box::new(Expr::col("amount")),
                Box::new(Expr::Parameter("min".into())),
            ),
        };
        let mut p = IndexMap::new();
        p.insert("min".to_string(), json!(20));
        match bind_action(&a, &p).unwrap() {
            Action::Filter { predicate } => assert_eq!(
                predicate,
                Expr::Binary(
                    etlantic_core::ir::BinaryOp::GtEq,
                    Box::new(Expr::col("amount")),
                    Box::new(Expr::Literal(Literal::Integer(20)))
                )
            ),
            _ => panic!("not a filter"),
        }
        let e = bind_action(&a, &IndexMap::new()).unwrap_err();
        assert_eq!(e.code(), "ETL209");
        assert!(e.to_string().contains("`min`"));
    }
}

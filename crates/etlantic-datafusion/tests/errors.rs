//! Every user error is a diagnostic with a code and a path, never a panic.

mod common;

use common::{e, eval, named, run, run_plan, schema, table};
use etlantic_core::ir::{Action, AggFunc, Aggregate, Expr, TransformPlanBuilder};
use indexmap::IndexMap;
use serde_json::json;

fn t() -> etlantic_core::data::Table {
    table(
        schema(&[("name", "string"), ("age", "integer"), ("ok", "boolean")]),
        &[
            json!({"name": "ada", "age": 36, "ok": true}),
            json!({"name": null, "age": 0, "ok": null}),
        ],
    )
}

async fn code_of(expr: &str) -> String {
    match eval(t(), expr).await {
        Ok(v) => panic!("`{expr}` should fail, got {v:?}"),
        Err(err) => {
            let d = err.diagnostics().iter().next().unwrap().clone();
            assert!(!d.message.is_empty());
            assert!(!d.help.is_empty(), "{d:?}");
            err.code().to_string()
        }
    }
}

#[tokio::test]
async fn unknown_columns_are_etl206_with_the_step_path() {
    let err = run(
        vec![("t", t())],
        vec![Action::Filter {
            predicate: e("nope > 1"),
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL206");
    let d = err.diagnostics().iter().next().unwrap();
    assert!(
        d.message.contains("`nope`") && d.message.contains("age"),
        "{d}"
    );
    assert!(d.path.starts_with("steps[t__a1_filter_"), "{}", d.path);
}

#[tokio::test]
async fn type_mismatches_are_etl302() {
    for expr in [
        "name > 1",
        "age && ok",
        "!age",
        "upper(age)",
        "name * 2",
        "-name",
        "concat(name, age)",
        "substr(name, 'x')",
        "case_when(age, 1)",
        "case_when(ok, 1, 'x')",
        "coalesce(name, 1)",
        "round(name)",
        "date_trunc(age, 'day')",
        "date_add(name, 1)",
        "extract('fortnight', age)",
        "sum(age)",
        "min(age)",
        "substr(name, -1)",
        "cast(age, 'list')",
        "upper(name, name)",
    ] {
        assert_eq!(code_of(expr).await, "ETL302", "{expr}");
    }
}

#[tokio::test]
async fn functions_outside_the_registry_are_etl306_and_unsupported_ones_etl501() {
    assert_eq!(code_of("frobnicate(name)").await, "ETL306");
    assert_eq!(code_of("acme:score(age)").await, "ETL306");
    assert_eq!(code_of("regex_matches(name, 'a.*')").await, "ETL501");
}

#[tokio::test]
async fn run_time_failures_are_etl707() {
    assert_eq!(code_of("10 / age").await, "ETL707");
    assert_eq!(code_of("age * 9223372036854775807").await, "ETL707");
}

#[tokio::test]
async fn missing_parameters_are_etl209() {
    let plan = TransformPlanBuilder::new("p")
        .input("t", Some(&t().schema))
        .step(Action::Filter {
            predicate: Expr::Binary(
                etlantic_core::ir::BinaryOp::Gt,
                Box::new(Expr::col("age")),
                Box::new(Expr::Parameter("min_age".into())),
            ),
        })
        .output("result", None)
        .build()
        .unwrap();
    let err = run_plan(plan.clone(), vec![("t", t())], IndexMap::new())
        .await
        .unwrap_err();
    assert_eq!(err.code(), "ETL209");
    assert!(err.to_string().contains("min_age"));
    let mut params = IndexMap::new();
    params.insert("min_age".to_string(), json!(18));
    let out = run_plan(plan, vec![("t", t())], params).await.unwrap();
    assert_eq!(out.num_rows(), 1);
}

#[tokio::test]
async fn plan_level_errors_have_codes() {
    // Duplicate output names.
    let err = run(
        vec![("t", t())],
        vec![Action::Project {
            fields: vec![named("a", "age"), named("a", "name")],
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL006");
    // Reserved names.
    let err = run(
        vec![("t", t())],
        vec![Action::WithFields {
            assignments: vec![named("__etl_ord", "age")],
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL006");
    let bad = table(schema(&[("__etl_x", "integer")]), &[json!({"__etl_x": 1})]);
    let err = run(
        vec![("t", bad)],
        vec![Action::Filter {
            predicate: e("true"),
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL006");
    // An aggregate without its argument.
    let err = run(
        vec![("t", t())],
        vec![Action::Aggregate {
            group_by: vec![],
            aggregates: vec![Aggregate {
                name: "s".into(),
                func: AggFunc::Sum,
                arg: None,
            }],
        }],
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL302");
}

/// Every function called with every arity from 0 to 3 over every column: errors carry a
/// code, nothing panics.
#[tokio::test]
async fn no_call_panics() {
    let functions: Vec<String> = etlantic_datafusion::capabilities::supported_functions();
    let args = ["name", "age", "ok", "'day'", "1", "null"];
    for f in &functions {
        for n in 0..=3usize {
            for a in &args {
                let call = format!(
                    "{}({})",
                    f,
                    std::iter::repeat_n(*a, n).collect::<Vec<_>>().join(", ")
                );
                let Ok(expr) = Expr::parse(&call) else {
                    continue;
                };
                let result = run(
                    vec![("t", t())],
                    vec![Action::Project {
                        fields: vec![etlantic_core::ir::NamedExpr {
                            name: "out".into(),
                            expr,
                        }],
                    }],
                )
                .await;
                if let Err(err) = result {
                    assert!(
                        ["ETL302", "ETL707", "ETL206", "ETL501"].contains(&err.code()),
                        "{call}: {err}"
                    );
                }
            }
        }
    }
}

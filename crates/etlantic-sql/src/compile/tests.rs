//! Unit tests of the compiler: every declared function compiles in its dialects, and
//! temporal literals are read as the column's kind.

use super::expr::ExprCompiler;
use super::*;
use crate::capabilities::{AGGREGATES, FUNCTIONS, POSTGRES_ONLY_FUNCTIONS};
use etlantic_core::ir::Expr;

fn rel() -> Rel {
    Rel {
        from: quote("t"),
        columns: vec![
            ("i".into(), Ty::Int),
            ("f".into(), Ty::Float),
            ("s".into(), Ty::Text),
            ("b".into(), Ty::Bool),
            ("ts".into(), Ty::Timestamp { zoned: true }),
        ],
    }
}

/// One expression per declared scalar function.
fn sample(f: &str) -> &'static str {
    match f {
        "dtcs:concat" => "concat(s, 'x')",
        "dtcs:substr" => "substr(s, 1, 2)",
        "dtcs:replace" => "replace(s, 'a', 'b')",
        "dtcs:length" => "length(s)",
        "dtcs:contains" => "contains(s, 'a')",
        "dtcs:starts_with" => "starts_with(s, 'a')",
        "dtcs:ends_with" => "ends_with(s, 'a')",
        "dtcs:trim" => "trim(s)",
        "dtcs:ltrim" => "ltrim(s)",
        "dtcs:rtrim" => "rtrim(s)",
        "dtcs:coalesce" => "coalesce(i, 0)",
        "dtcs:if_null" => "if_null(s, 'x')",
        "dtcs:null_if" => "null_if(i, 1)",
        "dtcs:case_when" => "case_when(b, 1, 2)",
        "dtcs:is_null" => "is_null(s)",
        "dtcs:abs" => "abs(f)",
        "dtcs:round" => "round(f, 1)",
        "dtcs:least" => "least(i, f)",
        "dtcs:greatest" => "greatest(i, f)",
        "dtcs:in" => "i in list(1, 2)",
        "dtcs:between" => "between(ts, '2024-01-01', '2024-02-01')",
        "dtcs:floor" => "floor(f)",
        "dtcs:ceil" => "ceil(f)",
        other => panic!("no sample for declared function {other}"),
    }
}

#[test]
fn every_declared_function_compiles_in_its_dialects() {
    for (d, fs) in [
        (Dialect::Sqlite, FUNCTIONS.to_vec()),
        (
            Dialect::Postgres,
            FUNCTIONS
                .iter()
                .chain(POSTGRES_ONLY_FUNCTIONS)
                .copied()
                .collect(),
        ),
    ] {
        for f in fs {
            let e = Expr::parse(sample(f)).unwrap();
            assert!(
                e.functions().contains(&f.to_string()),
                "{f}: {:?}",
                e.functions()
            );
            ExprCompiler::over(d, &rel())
                .compile(&e)
                .unwrap_or_else(|err| panic!("{f} in {d:?}: {err}"));
        }
        // Undeclared functions are refused, never approximated.
        let e = Expr::parse("upper(s)").unwrap();
        let err = ExprCompiler::over(d, &rel()).compile(&e).unwrap_err();
        assert_eq!(err.code(), "ETL501");
    }
    for f in POSTGRES_ONLY_FUNCTIONS {
        let e = Expr::parse(sample(f)).unwrap();
        assert!(ExprCompiler::over(Dialect::Sqlite, &rel())
            .compile(&e)
            .is_err());
    }
    assert_eq!(AGGREGATES.len(), 9);
}

#[test]
fn sqlite_reads_temporal_literals_as_integers() {
    let e = Expr::parse("ts >= '2024-01-01T00:00:01Z'").unwrap();
    let c = ExprCompiler::over(Dialect::Sqlite, &rel())
        .compile(&e)
        .unwrap();
    assert_eq!(c.sql, "(\"ts\" >= 1704067201000000)");
    let c = ExprCompiler::over(Dialect::Postgres, &rel())
        .compile(&e)
        .unwrap();
    assert!(
        c.sql
            .contains("CAST('2024-01-01T00:00:01Z' AS TIMESTAMPTZ)"),
        "{}",
        c.sql
    );
}

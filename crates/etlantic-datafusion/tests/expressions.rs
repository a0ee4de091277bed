//! Expressions: SQL three-valued logic and the DTCS functions, evaluated on real rows.

mod common;

use common::{eval, schema, table};
use etlantic_core::data::Table;
use serde_json::{json, Value};

/// Rows with a boolean pair covering true/false/null × true/false/null.
fn truth_table() -> Table {
    let vals = [json!(true), json!(false), Value::Null];
    let mut rows = Vec::new();
    for a in &vals {
        for b in &vals {
            rows.push(json!({"a": a, "b": b}));
        }
    }
    table(schema(&[("a", "boolean"), ("b", "boolean")]), &rows)
}

async fn tt(expr: &str) -> Vec<Value> {
    eval(truth_table(), expr)
        .await
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
}

const T: Value = Value::Bool(true);
const F: Value = Value::Bool(false);
const N: Value = Value::Null;

#[tokio::test]
async fn kleene_and_or_not() {
    // Rows: (T,T) (T,F) (T,N) (F,T) (F,F) (F,N) (N,T) (N,F) (N,N)
    assert_eq!(tt("a && b").await, vec![T, F, N, F, F, F, N, F, N]);
    assert_eq!(tt("a || b").await, vec![T, T, T, T, F, N, T, N, N]);
    assert_eq!(tt("!a").await, vec![F, F, F, T, T, T, N, N, N]);
}

#[tokio::test]
async fn comparisons_with_null_are_null_except_null_safe_equality() {
    assert_eq!(tt("a == b").await, vec![T, F, N, F, T, N, N, N, N]);
    assert_eq!(tt("a != b").await, vec![F, T, N, T, F, N, N, N, N]);
    assert_eq!(tt("a <=> b").await, vec![T, F, F, F, T, F, F, F, T]);
}

fn numbers() -> Table {
    table(
        schema(&[
            ("i", "integer"),
            ("j", "integer"),
            ("d", "decimal"),
            ("s", "string"),
        ]),
        &[
            json!({"i": 7, "j": 2, "d": 1.5, "s": "Hello"}),
            json!({"i": -7, "j": 2, "d": null, "s": null}),
            json!({"i": null, "j": 3, "d": 2.25, "s": "  pad  "}),
        ],
    )
}

async fn n(expr: &str) -> Vec<Value> {
    eval(numbers(), expr)
        .await
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
}

#[tokio::test]
async fn integer_and_decimal_arithmetic() {
    assert_eq!(n("i + j").await, vec![json!(9), json!(-5), N]);
    assert_eq!(n("i - j * 2").await, vec![json!(3), json!(-11), N]);
    // Integer division truncates toward zero; modulo keeps the dividend's sign.
    assert_eq!(n("i / j").await, vec![json!(3), json!(-3), N]);
    assert_eq!(n("i % j").await, vec![json!(1), json!(-1), N]);
    assert_eq!(n("i * d").await, vec![json!(10.5), N, N]);
    assert_eq!(n("-i").await, vec![json!(-7), json!(7), N]);
    assert_eq!(n("j / 2.0").await, vec![json!(1.0), json!(1.0), json!(1.5)]);
}

#[tokio::test]
async fn comparisons_and_membership() {
    assert_eq!(n("i > d").await, vec![T, N, N]);
    assert_eq!(n("i in list(7, 8)").await, vec![T, F, N]);
    assert_eq!(n("j between 2 and 2").await, vec![T, T, F]);
    assert_eq!(n("dtcs:between(i, j, 10)").await, vec![T, F, N]);
    assert_eq!(n("s contains 'ell'").await, vec![T, N, F]);
    assert_eq!(n("contains(s, 'pad')").await, vec![F, N, T]);
    assert_eq!(n("starts_with(s, 'He')").await, vec![T, N, F]);
    assert_eq!(n("ends_with(s, 'lo')").await, vec![T, N, F]);
}

#[tokio::test]
async fn string_functions() {
    assert_eq!(
        n("upper(s)").await,
        vec![json!("HELLO"), N, json!("  PAD  ")]
    );
    assert_eq!(
        n("lower(s)").await,
        vec![json!("hello"), N, json!("  pad  ")]
    );
    // concat propagates null; concat_ws skips it.
    assert_eq!(
        n("concat(s, '!')").await,
        vec![json!("Hello!"), N, json!("  pad  !")]
    );
    assert_eq!(
        n("concat_ws('-', s, 'x')").await,
        vec![json!("Hello-x"), json!("x"), json!("  pad  -x")]
    );
    assert_eq!(
        n("s + '?'").await,
        vec![json!("Hello?"), N, json!("  pad  ?")]
    );
    // substr counts from 0; past the end gives ''.
    assert_eq!(
        n("substr(s, 1, 3)").await,
        vec![json!("ell"), N, json!(" pa")]
    );
    assert_eq!(n("substr(s, 3)").await, vec![json!("lo"), N, json!("ad  ")]);
    assert_eq!(n("substr(s, 10)").await, vec![json!(""), N, json!("")]);
    assert_eq!(
        n("replace(s, 'l', 'L')").await,
        vec![json!("HeLLo"), N, json!("  pad  ")]
    );
    assert_eq!(n("length(s)").await, vec![json!(5), N, json!(7)]);
    assert_eq!(n("trim(s)").await, vec![json!("Hello"), N, json!("pad")]);
    assert_eq!(n("ltrim(s)").await, vec![json!("Hello"), N, json!("pad  ")]);
    assert_eq!(n("rtrim(s)").await, vec![json!("Hello"), N, json!("  pad")]);
    assert_eq!(
        n("trim(s, 'Ho')").await,
        vec![json!("ell"), N, json!("  pad  ")]
    );
}

#[tokio::test]
async fn trim_removes_unicode_white_space() {
    let t = table(
        schema(&[("s", "string")]),
        &[json!({"s": "\u{a0}\u{2003}x\t\n"})],
    );
    assert_eq!(eval(t, "trim(s)").await.unwrap(), vec![json!("x")]);
}

#[tokio::test]
async fn null_handling_functions() {
    assert_eq!(
        n("coalesce(s, 'none')").await,
        vec![json!("Hello"), json!("none"), json!("  pad  ")]
    );
    assert_eq!(
        n("if_null(d, 0.0)").await,
        vec![json!(1.5), json!(0.0), json!(2.25)]
    );
    assert_eq!(n("null_if(j, 3)").await, vec![json!(2), json!(2), N]);
    assert_eq!(n("is_null(d)").await, vec![F, T, F]);
    assert_eq!(n("is_missing(d)").await, vec![F, F, F]);
    assert_eq!(n("is_missing(nope)").await, vec![T, T, T]);
    assert_eq!(n("is_invalid(d)").await, vec![F, F, F]);
    // case_when: flat (cond, value)* [else]; a null condition is skipped.
    assert_eq!(
        n("case_when(i > 0, 'pos', i < 0, 'neg', 'none')").await,
        vec![json!("pos"), json!("neg"), json!("none")]
    );
    assert_eq!(n("case_when(i > 0, 'pos')").await, vec![json!("pos"), N, N]);
}

#[tokio::test]
async fn conversions() {
    assert_eq!(n("to_string(i)").await, vec![json!("7"), json!("-7"), N]);
    assert_eq!(
        n("to_decimal(j)").await,
        vec![json!(2.0), json!(2.0), json!(3.0)]
    );
    assert_eq!(
        n("to_integer(j / 1)").await,
        vec![json!(2), json!(2), json!(3)]
    );
    assert_eq!(
        n("cast(j, 'string')").await,
        vec![json!("2"), json!("2"), json!("3")]
    );
    let t = table(
        schema(&[("s", "string")]),
        &[json!({"s": "42"}), json!({"s": "x"}), json!({"s": null})],
    );
    assert_eq!(
        eval(t.clone(), "try_cast(s, 'integer')").await.unwrap(),
        vec![json!(42), N, N]
    );
    assert_eq!(
        eval(t.clone(), "try_cast(s, 'decimal', 'null')")
            .await
            .unwrap(),
        vec![json!(42.0), N, N]
    );
    // A strict cast of a bad value fails at run time.
    let err = eval(t.clone(), "cast(s, 'integer')").await.unwrap_err();
    assert_eq!(err.code(), "ETL707");
    let err = eval(
        table(schema(&[("d", "decimal")]), &[json!({"d": 1.5})]),
        "to_integer(d)",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL707");
    assert!(err.to_string().contains("integer-valued"), "{err}");
    let err = eval(t, "cast(s, 'money')").await.unwrap_err();
    assert_eq!(err.code(), "ETL302");
}

#[tokio::test]
async fn numeric_functions_return_decimals() {
    assert_eq!(n("abs(i)").await, vec![json!(7), json!(7), N]);
    assert_eq!(n("round(d)").await, vec![json!(2.0), N, json!(2.0)]);
    // Ties to even: 2.25 to one place is 2.2.
    assert_eq!(n("round(d, 1)").await, vec![json!(1.5), N, json!(2.2)]);
    assert_eq!(n("floor(d)").await, vec![json!(1.0), N, json!(2.0)]);
    assert_eq!(n("ceil(j)").await, vec![json!(2.0), json!(2.0), json!(3.0)]);
    assert_eq!(
        n("power(j, 2)").await,
        vec![json!(4.0), json!(4.0), json!(9.0)]
    );
    assert_eq!(
        n("sqrt(d * 4)").await,
        vec![json!(6.0f64.sqrt()), N, json!(3.0)]
    );
    // least/greatest are null when any argument is; of integers they are integers.
    assert_eq!(n("least(i, j)").await, vec![json!(2), json!(-7), N]);
    assert_eq!(n("greatest(i, j, 5)").await, vec![json!(7), json!(5), N]);
    assert_eq!(n("greatest(i, d)").await, vec![json!(7.0), N, N]);
    let err = eval(
        table(schema(&[("d", "decimal")]), &[json!({"d": -1.0})]),
        "sqrt(d)",
    )
    .await
    .unwrap_err();
    assert_eq!(err.code(), "ETL707");
}

fn times() -> Table {
    table(
        schema(&[("d", "date"), ("t", "datetime")]),
        &[
            json!({"d": "2024-01-31", "t": "2024-03-10T13:45:30Z"}),
            json!({"d": null, "t": null}),
        ],
    )
}

async fn tm(expr: &str) -> Vec<Value> {
    eval(times(), expr)
        .await
        .unwrap_or_else(|e| panic!("{expr}: {e}"))
}

#[tokio::test]
async fn date_functions() {
    assert_eq!(
        tm("date_trunc(t, 'hour')").await,
        vec![json!("2024-03-10T13:00:00Z"), N]
    );
    assert_eq!(
        tm("date_trunc(d, 'month')").await,
        vec![json!("2024-01-01T00:00:00Z"), N]
    );
    // Month arithmetic clamps to the end of the month.
    assert_eq!(
        tm("date_add(d, 1, 'month')").await,
        vec![json!("2024-02-29"), N]
    );
    assert_eq!(tm("date_add(d, 2)").await, vec![json!("2024-02-02"), N]);
    assert_eq!(
        tm("date_add(t, -90, 'minute')").await,
        vec![json!("2024-03-10T12:15:30Z"), N]
    );
    assert_eq!(tm("extract('year', t)").await, vec![json!(2024), N]);
    assert_eq!(tm("date_part(d, 'day')").await, vec![json!(31), N]);
    assert_eq!(tm("extract('minute', t)").await, vec![json!(45), N]);
    assert_eq!(tm("t > '2024-01-01T00:00:00Z'").await, vec![T, N]);
    let today = tm("current_date() >= d").await;
    assert_eq!(today, vec![T, N]);
    assert_eq!(tm("current_timestamp() > t").await, vec![T, N]);
}

#[tokio::test]
async fn row_level_errors_fire_only_on_offending_rows() {
    // A start that folds to a constant must not trip the negative-start check.
    assert_eq!(
        n("substr(s, 0 + 1, 3)").await,
        vec![json!("ell"), N, json!(" pa")]
    );
    let t = table(
        schema(&[("s", "string"), ("start", "integer"), ("d", "decimal")]),
        &[
            json!({"s": "abc", "start": 1, "d": 3.0}),
            json!({"s": "abc", "start": -1, "d": 2.5}),
        ],
    );
    let err = eval(t.clone(), "substr(s, start)").await.unwrap_err();
    assert_eq!(err.code(), "ETL707");
    assert!(err.to_string().contains("must not be negative"), "{err}");
    let err = eval(t.clone(), "to_integer(d)").await.unwrap_err();
    assert!(err.to_string().contains("got 2.5"), "{err}");
    // Once the offending row is filtered out, the same expressions run.
    let ok = common::run(
        vec![("t", t)],
        vec![
            etlantic_core::ir::Action::Filter {
                predicate: common::e("start >= 0"),
            },
            etlantic_core::ir::Action::Project {
                fields: vec![
                    common::named("tail", "substr(s, start)"),
                    common::named("n", "to_integer(d)"),
                ],
            },
        ],
    )
    .await
    .unwrap();
    assert_eq!(common::rows(&ok), vec![json!({"tail": "bc", "n": 3})]);
}

#[tokio::test]
async fn membership_in_strings_and_lists() {
    let t = table(
        schema(&[("s", "string"), ("items", "list<string>")]),
        &[
            json!({"s": "ab", "items": ["a", "b"]}),
            json!({"s": "zz", "items": []}),
            json!({"s": null, "items": null}),
        ],
    );
    assert_eq!(eval(t.clone(), "s in 'xabx'").await.unwrap(), vec![T, F, N]);
    assert_eq!(
        eval(t.clone(), "'a' in items").await.unwrap(),
        vec![T, F, N]
    );
    assert_eq!(
        eval(t.clone(), "items contains 'b'").await.unwrap(),
        vec![T, F, N]
    );
    assert_eq!(
        eval(t, "s in list('ab', null)").await.unwrap(),
        vec![T, N, N]
    );
}

/// Every function the capabilities claim has a working sample call here, so a function
/// added to the list without an implementation (or a test) fails this test.
#[tokio::test]
async fn every_claimed_scalar_function_runs() {
    let samples: &[(&str, &str)] = &[
        ("dtcs:lower", "lower(s)"),
        ("dtcs:upper", "upper(s)"),
        ("dtcs:concat", "concat(s, s)"),
        ("dtcs:concat_ws", "concat_ws(',', s)"),
        ("dtcs:substr", "substr(s, 1)"),
        ("dtcs:replace", "replace(s, 'a', 'b')"),
        ("dtcs:length", "length(s)"),
        ("dtcs:contains", "contains(s, 'x')"),
        ("dtcs:starts_with", "starts_with(s, 'x')"),
        ("dtcs:ends_with", "ends_with(s, 'x')"),
        ("dtcs:trim", "trim(s)"),
        ("dtcs:ltrim", "ltrim(s)"),
        ("dtcs:rtrim", "rtrim(s)"),
        ("dtcs:coalesce", "coalesce(i, j)"),
        ("dtcs:if_null", "if_null(i, 0)"),
        ("dtcs:null_if", "null_if(i, 0)"),
        ("dtcs:case_when", "case_when(i > 0, 1, 2)"),
        ("dtcs:is_null", "is_null(i)"),
        ("dtcs:is_missing", "is_missing(i)"),
        ("dtcs:is_invalid", "is_invalid(i)"),
        ("dtcs:cast", "cast(i, 'decimal')"),
        ("dtcs:try_cast", "try_cast(s, 'integer')"),
        ("dtcs:to_string", "to_string(d)"),
        ("dtcs:to_integer", "to_integer(j)"),
        ("dtcs:to_decimal", "to_decimal(j)"),
        ("dtcs:abs", "abs(d)"),
        ("dtcs:round", "round(d, 1)"),
        ("dtcs:floor", "floor(d)"),
        ("dtcs:ceil", "ceil(d)"),
        ("dtcs:power", "power(d, 2)"),
        ("dtcs:sqrt", "sqrt(j)"),
        ("dtcs:least", "least(i, j)"),
        ("dtcs:greatest", "greatest(i, j)"),
        ("dtcs:in", "i in list(1, 2)"),
        ("dtcs:between", "i between 0 and 1"),
        ("dtcs:date_trunc", "date_trunc(current_timestamp(), 'day')"),
        ("dtcs:date_add", "date_add(current_date(), 1)"),
        ("dtcs:extract", "extract('year', current_date())"),
        ("dtcs:date_part", "date_part('month', current_timestamp())"),
        ("dtcs:current_date", "current_date()"),
        ("dtcs:current_timestamp", "current_timestamp()"),
        ("dtcs:split", "split(s, ',')"),
        ("dtcs:regex_extract", "regex_extract(s, '[a-z]+', 0)"),
        ("dtcs:regex_replace", "regex_replace(s, '[0-9]', '#')"),
        ("dtcs:array", "array(i, j)"),
        ("dtcs:size", "size(array(i, j))"),
        ("dtcs:index", "index(array(i, j), 0)"),
        ("dtcs:element_at", "element_at(array(i, j), 5)"),
        ("dtcs:object", "object('a', i)"),
        ("dtcs:field", "field(object('a', i), 'a')"),
    ];
    let claimed = etlantic_datafusion::capabilities::supported_functions();
    let aggregates = etlantic_datafusion::capabilities::SUPPORTED_AGGREGATES;
    for f in claimed.iter().filter(|f| {
        !aggregates.contains(&f.as_str())
            && !etlantic_core::ir::WINDOW_FUNCTIONS.contains(&f.as_str())
    }) {
        assert!(
            samples.iter().any(|(id, _)| id == f),
            "no sample for claimed function {f}"
        );
    }
    for (id, expr) in samples {
        let parsed = common::e(expr);
        assert!(
            parsed.functions().contains(&id.to_string()),
            "{expr} does not call {id}"
        );
        let out = n(expr).await;
        assert_eq!(out.len(), 3, "{expr}");
    }
}

/// The functions and semantics ETLantic-py's conformance corpus asks for.
#[tokio::test]
async fn etlantic_py_functions() {
    let all = |v: Value| vec![v.clone(), v.clone(), v];
    // Ties to even.
    assert_eq!(n("round(2.5)").await, all(json!(2.0)));
    assert_eq!(n("round(-2.5)").await, all(json!(-2.0)));
    assert_eq!(n("round(2.25, 1)").await, all(json!(2.2)));
    assert_eq!(n("round(0.125, 2)").await, all(json!(0.12)));
    assert_eq!(n("round(d)").await, vec![json!(2.0), N, json!(2.0)]);
    // Integers stay integers.
    assert_eq!(n("least(i, j)").await, vec![json!(2), json!(-7), N]);
    assert_eq!(
        n("greatest(j, 2.5)").await,
        vec![json!(2.5), json!(2.5), json!(3.0)]
    );
    // Lists and objects.
    assert_eq!(n("size(array(i, j))").await, all(json!(2)));
    assert_eq!(n("index(array('x', 'y'), 0)").await, all(json!("x")));
    assert_eq!(n("index(array('x', 'y'), -1)").await, all(json!("y")));
    assert_eq!(n("element_at(array('x', 'y'), 5)").await, all(N));
    assert!(
        eval(numbers(), "index(array('x', 'y'), 2)").await.is_err(),
        "an index out of bounds is an error"
    );
    assert_eq!(
        n("field(object('city', s), 'city')").await,
        vec![json!("Hello"), N, json!("  pad  ")]
    );
    assert!(eval(numbers(), "field(object('city', s), 'town')")
        .await
        .is_err());
    // Strings and regular expressions.
    assert_eq!(n("split('a,b', ',')").await, all(json!(["a", "b"])));
    assert_eq!(
        n("regex_extract('x12y', '([0-9]+)', 1)").await,
        all(json!("12"))
    );
    assert_eq!(n("regex_extract('x12y', '[a-z]')").await, all(json!("x")));
    assert_eq!(n("regex_extract('abc', '[0-9]')").await, all(N));
    assert_eq!(
        n("regex_replace('A12B3', '[0-9]+', 'N')").await,
        all(json!("ANBN"))
    );
    assert_eq!(
        n("regex_replace(s, 'l+', '_')").await,
        vec![json!("He_o"), N, json!("  pad  ")]
    );
}

//! The Polars backend against the reference engine (DataFusion), case by case: every
//! case runs as one portable step on both, and both must give the same schema and rows
//! (or fail the same way).

mod common;

use common::{assert_same, assert_same_error, compare, Case, Outcome};
use etlantic_core::plugin::Backend;
use etlantic_polars::PolarsBackend;

const ORDERS: &str = r#"
  orders:
    columns: {id: integer, customer: string, amount: 'decimal(10,2)', qty: integer, region: string, ts: timestamp, paid: boolean, score: float}
    rows:
    - [1, alice, '10.50', 2, eu, '2024-01-01T10:00:00Z', true, 1.5]
    - [2, bob, '3.25', 1, us, '2024-01-01T11:30:00Z', false, -2.25]
    - [3, alice, null, 5, eu, '2024-01-02T09:15:00Z', null, null]
    - [4, carol, '99.99', 1, null, '2024-01-03T00:00:00Z', true, 0.1]
    - [5, bob, '3.25', 3, us, '2024-01-03T12:00:00Z', true, 2.5]
    - [6, dave, '0.00', 0, apac, '2024-01-04T08:45:00Z', false, -0.5]
    - [7, null, '1.01', null, eu, null, false, 3.5]
"#;

const CUSTOMERS: &str = r#"
  customers:
    columns: {customer: string, tier: string, limit: integer}
    rows:
    - [alice, gold, 100]
    - [bob, silver, 5]
    - [erin, gold, 50]
    - [null, none, 0]
    - [bob, bronze, 1]
"#;

fn case(inputs: &[&str], rest: &str) -> String {
    format!("inputs:{}\n{rest}", inputs.concat())
}

async fn same(name: &str, inputs: &[&str], rest: &str) {
    assert_same(name, &case(inputs, rest)).await;
}

async fn fails(name: &str, inputs: &[&str], rest: &str, code: &str) {
    assert_same_error(name, &case(inputs, rest), code).await;
}

#[tokio::test]
async fn filters_and_projections() {
    same(
        "three_valued",
        &[ORDERS],
        "steps:\n- filter: '!(paid && qty > 1) || region == ''us'''\n",
    )
    .await;
    same(
        "null_comparison",
        &[ORDERS],
        "steps:\n- filter: 'region != ''eu'''\n",
    )
    .await;
    same(
        "null_safe",
        &[ORDERS],
        "steps:\n- filter: 'region <=> null || customer <=> ''bob'''\n",
    )
    .await;
    same(
        "project_exprs",
        &[ORDERS],
        "steps:\n- select: [id, {twice: 'qty * 2'}, {label: 'customer + ''@'' + region'}]\n",
    )
    .await;
    same(
        "with_fields_in_order",
        &[ORDERS],
        "steps:\n- with_columns: {qty: qty + 1, q2: qty * 10, id: 'id - 100'}\n",
    )
    .await;
    same(
        "rename_swap",
        &[ORDERS],
        "steps:\n- rename: {id: qty, qty: id}\n",
    )
    .await;
    same("drop", &[ORDERS], "steps:\n- drop: [ts, score]\n").await;
    same(
        "drop_missing_ignored",
        &[ORDERS],
        "steps:\n- action: dtcs:drop_fields\n  parameters: {fields: [nope, ts], missingPolicy: ignore}\n",
    )
    .await;
    fails(
        "drop_missing",
        &[ORDERS],
        "steps:\n- drop: [nope]\n",
        "ETL206",
    )
    .await;
    fails(
        "unknown_column",
        &[ORDERS],
        "steps:\n- filter: 'nope > 1'\n",
        "ETL206",
    )
    .await;
    same(
        "literal_only_projection",
        &[ORDERS],
        "steps:\n- select: [{one: '1'}, {n: 'null'}]\n",
    )
    .await;
    same(
        "filter_then_empty",
        &[ORDERS],
        "steps:\n- filter: 'qty > 100'\n",
    )
    .await;
}

#[tokio::test]
async fn arithmetic() {
    same(
        "integers",
        &[ORDERS],
        "steps:\n- with_columns: {d: 'id / 2', m: 'id % 4', n: '-id', neg_div: '(0 - id) / 4', neg_mod: '(0 - id) % 4', x: 'qty * 10 + id'}\n",
    )
    .await;
    same(
        "floats",
        &[ORDERS],
        "steps:\n- with_columns: {a: 'score * 2', b: 'score / 0.0', c: 'score % 1', d: 'score + qty', e: '-score'}\n",
    )
    .await;
    same(
        "decimals",
        &[ORDERS],
        "steps:\n- with_columns: {a: 'amount + qty', b: 'amount * amount', c: 'amount - 1', d: 'amount * 1.5', e: '-amount', f: 'abs(amount - 50)'}\n",
    )
    .await;
    same(
        "decimal_comparisons",
        &[ORDERS],
        "steps:\n- filter: 'amount > 3 && amount <= 10.5 || amount == 99.99'\n",
    )
    .await;
    fails(
        "integer_overflow",
        &[ORDERS],
        "steps:\n- with_columns: {x: 'id * 9223372036854775807'}\n",
        "ETL707",
    )
    .await;
    fails(
        "division_by_zero",
        &[ORDERS],
        "steps:\n- with_columns: {x: 'id / (qty - qty)'}\n",
        "ETL707",
    )
    .await;
    fails(
        "modulo_by_zero",
        &[ORDERS],
        "steps:\n- with_columns: {x: 'id % 0'}\n",
        "ETL707",
    )
    .await;
    same(
        "guarded_branches",
        &[ORDERS],
        "steps:\n- with_columns: {x: 'case_when(qty != 0, id / qty, -1)', y: 'coalesce(id, qty / 0)', z: 'case_when(qty == 0, 0, qty > 0, 100 / qty)'}\n",
    )
    .await;
    fails(
        "unguarded_coalesce",
        &[ORDERS],
        "steps:\n- with_columns: {y: 'coalesce(qty, id / 0)'}\n",
        "ETL707",
    )
    .await;
    same(
        "string_plus",
        &[ORDERS],
        "steps:\n- with_columns: {s: 'customer + region'}\n",
    )
    .await;
    fails(
        "type_error",
        &[ORDERS],
        "steps:\n- with_columns: {s: 'customer * 2'}\n",
        "ETL302",
    )
    .await;
}

/// `&&`/`||` evaluate their right side only where the left one does not decide the
/// result (as PostgreSQL and SQLite do); the reference engine evaluates it on the whole
/// batch unless the left side decides every row, so it fails here where Polars does not.
#[tokio::test]
async fn and_or_evaluate_the_right_side_only_where_needed() {
    for e in ["qty == 0 || id / qty > 1", "qty != 0 && id / qty >= 1"] {
        let c = Case::parse(
            "lazy",
            &case(
                &[ORDERS],
                &format!("steps:\n- with_columns: {{x: '{e}'}}\n"),
            ),
        );
        match common::run(&PolarsBackend, &c).await {
            common::Run::Ok(t, _) => assert_eq!(t.num_rows(), 7),
            other => panic!("{e}: {other:?}"),
        }
    }
    // Where every row needs the right side, both fail.
    fails(
        "eager",
        &[ORDERS],
        "steps:\n- with_columns: {x: 'qty >= 0 || id / 0 > 1'}\n",
        "ETL707",
    )
    .await;
}

#[tokio::test]
async fn functions() {
    same(
        "strings",
        &[ORDERS],
        r#"steps:
- with_columns:
    u: upper(customer)
    l: lower(region)
    c: "concat(customer, '-', region)"
    cw: "concat_ws('/', customer, region, 'x')"
    s1: "substr(customer, 1, 3)"
    s2: "substr(customer, 2)"
    s3: "substr(customer, 10, 2)"
    r: "replace(customer, 'b', 'BB')"
    n: length(customer)
    k: "contains(customer, 'o')"
    sw: "starts_with(customer, 'a')"
    ew: "ends_with(customer, 'e')"
"#,
    )
    .await;
    same(
        "unicode",
        &[r#"
  t:
    columns: {id: integer, s: string}
    rows:
    - [1, "  Ärger\u00a0 "]
    - [2, "straße"]
    - [3, "\u2003ΣΑΣ\t"]
    - [4, "xxhixx"]
    - [5, null]
    - [6, ""]
"#],
        r#"steps:
- with_columns:
    u: upper(s)
    l: lower(s)
    t: trim(s)
    lt: ltrim(s)
    rt: rtrim(s)
    tx: "trim(s, 'x')"
    n: length(s)
    p: "substr(s, 1, 2)"
    e: "replace(s, '', '-')"
"#,
    )
    .await;
    same(
        "null_handling",
        &[ORDERS],
        r#"steps:
- with_columns:
    a: "coalesce(amount, 0)"
    b: "if_null(region, 'none')"
    c: "coalesce(qty, amount, score)"
    d: "null_if(qty, 1)"
    e: is_null(region)
    f: "case_when(qty >= 3, 'big', qty >= 1, 'small')"
    g: "case_when(paid, amount, score)"
    h: "!paid"
    i: is_missing(region)
    j: is_invalid(region)
"#,
    )
    .await;
    same(
        "math",
        &[ORDERS],
        r#"steps:
- with_columns:
    a: abs(score)
    b: "abs(0 - id)"
    r0: round(score)
    r1: "round(amount, 1)"
    r2: "round(qty * 1.25, -1)"
    f: floor(score)
    c: ceil(amount)
    p: "power(qty, 2)"
    q: sqrt(qty)
    lo: "least(qty, id, amount)"
    hi: "greatest(qty, score)"
    mn: "min(qty, id)"
    mx: "max(qty, id)"
"#,
    )
    .await;
    fails(
        "sqrt_negative",
        &[ORDERS],
        "steps:\n- with_columns: {q: sqrt(score)}\n",
        "ETL707",
    )
    .await;
    same(
        "sqrt_guarded",
        &[ORDERS],
        "steps:\n- with_columns: {q: 'case_when(score >= 0, sqrt(score))'}\n",
    )
    .await;
    fails(
        "between_text_and_timestamp",
        &[ORDERS],
        "steps:\n- with_columns: {x: \"between(ts, '2024-01-02', '2024-01-03')\"}\n",
        "ETL302",
    )
    .await;
    fails(
        "abs_overflow",
        &[ORDERS],
        "steps:\n- with_columns: {q: 'abs(id - 9223372036854775807 - 2)'}\n",
        "ETL707",
    )
    .await;
    same(
        "membership",
        &[ORDERS],
        r#"steps:
- with_columns:
    a: "between(qty, 1, 3)"
    b: "between(amount, 1, null)"
    c: "in(customer, 'alice and bob')"
    d: "in(qty, 3)"
    e: "in(region, region)"
"#,
    )
    .await;
    same(
        "in_list",
        &[ORDERS],
        r#"steps:
- action: dtcs:with_fields
  parameters:
    assignments:
    - name: a
      expression: {kind: call, callee: dtcs:in, args: [{kind: fieldRef, target: qty}, {kind: call, callee: dtcs:list, args: [{kind: literal, value: {type: integer, value: 1}}, {kind: literal, value: {type: integer, value: 5}}]}]}
    - name: b
      expression: {kind: call, callee: dtcs:in, args: [{kind: fieldRef, target: qty}, {kind: call, callee: dtcs:list, args: [{kind: literal, value: {type: integer, value: 1}}, {kind: literal, value: {type: 'null', value: null}}]}]}
"#,
    )
    .await;
    fails(
        "unknown_function",
        &[ORDERS],
        "steps:\n- with_columns: {x: 'frobnicate(id)'}\n",
        "ETL306",
    )
    .await;
}

#[tokio::test]
async fn temporal_values() {
    same(
        "timestamps",
        &[ORDERS],
        "steps:\n- filter: 'ts >= ''2024-01-02'' && ts < ''2024-01-03T12:00:00Z'''\n- select: [id, ts]\n",
    )
    .await;
    same(
        "dates",
        &[r#"
  d:
    columns: {id: integer, day: date, at: timestamp_ns}
    rows:
    - [1, '2024-01-01', '2024-01-01T00:00:00.000000001']
    - [2, '2024-02-29', '2024-03-01T12:00:00']
    - [3, null, null]
"#],
        "steps:\n- filter: 'day <= ''2024-02-29'' || at > ''2024-01-01'''\n- sort: [{expr: day, descending: true}]\n",
    )
    .await;
}

#[tokio::test]
async fn narrow_and_wide_types() {
    same(
        "types",
        &[r#"
  t:
    columns: {a: int8, b: int16, c: uint8, d: float32, e: int32, f: large_string, g: uint32, h: uint64}
    rows:
    - [1, 300, 200, 1.5, 100000, x, 7, 18446744073709551615]
    - [-128, -2, 0, null, null, null, null, null]
    - [127, 5, 255, -0.25, -7, yz, 0, 0]
"#],
        "steps:\n- with_columns: {s: 'a + b', p: 'd * 2', q: 'e / 3', r: 'upper(f)', m: 'c * g'}\n- sort: [a]\n",
    )
    .await;
    same(
        "narrow_aggregates",
        &[r#"
  t:
    columns: {k: int8, v: int32, f: float32}
    rows:
    - [1, 2147483647, 1.5]
    - [1, 2147483647, 2.5]
    - [2, -5, null]
"#],
        "steps:\n- aggregate: {group_by: [k], aggregates: {s: sum(v), m: max(v), a: average(f), n: count(f)}}\n",
    )
    .await;
}

#[tokio::test]
async fn aggregates() {
    same(
        "every_aggregate",
        &[ORDERS],
        r#"steps:
- aggregate:
    group_by: [region]
    aggregates:
      n: count_all()
      c: count(amount)
      cd: count_distinct(customer)
      s: sum(amount)
      sq: sum(qty)
      sf: sum(score)
      a: average(amount)
      aq: average(qty)
      mi: min(customer)
      ma: max(ts)
      mb: min(paid)
      f: first(amount)
      l: last(customer)
"#,
    )
    .await;
    // Sample and population variance and standard deviation; a group of one value has
    // no sample variance. Polars and DataFusion sum in other orders: equal to rounding.
    same(
        "variance_and_stddev",
        &[ORDERS],
        "steps:\n- aggregate: {group_by: [region], aggregates: {v: variance(qty), s: stddev(amount), vp: \"variance(qty, 'population')\", sp: \"stddev(score, 'population')\"}}\ntolerance: 1.0e-12\n",
    )
    .await;
    same(
        "computed_groups",
        &[ORDERS],
        "steps:\n- aggregate: {group_by: [{name: big, expression: 'qty > 1'}], aggregates: {n: count_all(), s: 'sum(qty * 2)', k: 'sum(1)', f: 'first(id)'}}\n",
    )
    .await;
    same(
        "global",
        &[ORDERS],
        "steps:\n- aggregate: {aggregates: {n: count_all(), s: sum(qty), a: average(amount), f: first(customer), l: last(customer)}}\n",
    )
    .await;
    same(
        "global_empty",
        &[ORDERS],
        "steps:\n- filter: 'id > 100'\n- aggregate: {aggregates: {n: count_all(), c: count(qty), s: sum(qty), a: average(amount), m: min(ts), f: first(id)}}\n",
    )
    .await;
    same(
        "sum_of_nulls",
        &[ORDERS],
        "steps:\n- aggregate: {group_by: [customer], aggregates: {s: sum(amount), a: average(score), f: first(amount), l: last(amount)}}\n",
    )
    .await;
    same(
        "decimal_average_truncates",
        &[r#"
  t:
    columns: {k: string, v: 'decimal(5,2)'}
    rows:
    - [a, '1.00']
    - [a, '2.00']
    - [a, '2.00']
    - [b, '-1.00']
    - [b, '-1.00']
    - [b, '-2.00']
    - [c, null]
"#],
        "steps:\n- aggregate: {group_by: [k], aggregates: {a: average(v), s: sum(v)}}\n",
    )
    .await;
    same(
        "first_last_follow_sort",
        &[ORDERS],
        "steps:\n- sort: [{expr: qty, descending: true}]\n- aggregate: {group_by: [paid], aggregates: {f: first(id), l: last(id)}}\n",
    )
    .await;
    same(
        "aggregate_then_sort",
        &[ORDERS],
        "ordered: true\nsteps:\n- aggregate: {group_by: [customer], aggregates: {n: count_all()}}\n- sort: [{expr: n, descending: true}, customer]\n",
    )
    .await;
}

#[tokio::test]
async fn ordering() {
    same(
        "stable_sort",
        &[ORDERS],
        "ordered: true\nsteps:\n- sort: [{expr: paid, descending: true}]\n",
    )
    .await;
    same(
        "nulls_first_and_last",
        &[ORDERS],
        "ordered: true\nsteps:\n- sort: [{expr: region, nulls: first}, {expr: amount, descending: true}]\n",
    )
    .await;
    same(
        "sort_by_expression",
        &[ORDERS],
        "ordered: true\nsteps:\n- sort: [{expr: 'qty % 2'}, {expr: 'upper(customer)', descending: true}]\n",
    )
    .await;
    same(
        "limit_offset",
        &[ORDERS],
        "ordered: true\nsteps:\n- sort: [{expr: score, descending: true}]\n- action: dtcs:limit\n  parameters: {count: 3, offset: 2}\n",
    )
    .await;
    same(
        "limit_beyond",
        &[ORDERS],
        "ordered: true\nsteps:\n- action: dtcs:limit\n  parameters: {count: 100, offset: 5}\n",
    )
    .await;
    same("distinct_rows", &[ORDERS], "ordered: true\nsteps:\n- select: [customer, region]\n- distinct: true\n- action: dtcs:limit\n  parameters: {count: 10}\n").await;
    same("distinct_fields", &[ORDERS], "ordered: true\nsteps:\n- distinct: [region]\n- action: dtcs:limit\n  parameters: {count: 10}\n").await;
    same(
        "dedup_first",
        &[ORDERS],
        "ordered: true\nsteps:\n- sort: [{expr: amount, descending: true}]\n- deduplicate: {keys: [customer]}\n- action: dtcs:limit\n  parameters: {count: 10}\n",
    )
    .await;
    same(
        "dedup_last",
        &[ORDERS],
        "ordered: true\nsteps:\n- action: dtcs:deduplicate\n  parameters: {keys: [region, paid], retain: last}\n- action: dtcs:limit\n  parameters: {count: 10}\n",
    )
    .await;
    same(
        "dedup_within_watermark",
        &[ORDERS],
        "steps:\n- deduplicate: {keys: [customer], within_watermark: true}\n",
    )
    .await;
}

#[tokio::test]
async fn joins() {
    for how in ["inner", "left", "right", "full", "semi", "anti"] {
        same(
            &format!("join_{how}"),
            &[ORDERS, CUSTOMERS],
            &format!("steps:\n- join: {{right: customers, 'on': [customer], how: {how}}}\n"),
        )
        .await;
        same(
            &format!("join_{how}_predicate"),
            &[ORDERS, CUSTOMERS],
            &format!(
                "steps:\n- join: {{right: customers, 'on': [customer], how: {how}, predicate: 'qty <= limit && tier != ''bronze'''}}\n"
            ),
        )
        .await;
        same(
            &format!("join_{how}_null_safe"),
            &[ORDERS, CUSTOMERS],
            &format!("steps:\n- join: {{right: customers, 'on': [customer], how: {how}, null_safe: true}}\n"),
        )
        .await;
        // Join order: left-major, then right order, unmatched right rows last.
        same(
            &format!("join_{how}_order"),
            &[ORDERS, CUSTOMERS],
            &format!(
                "ordered: true\nsteps:\n- join: {{right: customers, 'on': [customer], how: {how}}}\n- action: dtcs:limit\n  parameters: {{count: 100}}\n"
            ),
        )
        .await;
    }
    same(
        "join_different_names_and_types",
        &[
            ORDERS,
            r#"
  regions:
    columns: {code: large_string, n: int32, label: string}
    rows:
    - [eu, 1, Europe]
    - [us, 3, America]
    - [us, 5, USA]
    - [null, 5, None]
"#,
        ],
        "ordered: true\nsteps:\n- join: {right: regions, 'on': {left: [region, qty], right: [code, n]}, how: full}\n- action: dtcs:limit\n  parameters: {count: 100}\n",
    )
    .await;
    same(
        "cross_join",
        &[ORDERS, CUSTOMERS],
        "ordered: true\nsteps:\n- select: [id, qty]\n- join: {right: customers, how: cross}\n- action: dtcs:limit\n  parameters: {count: 100}\n",
    )
    .await;
    same(
        "predicate_only_left_join",
        &[ORDERS, CUSTOMERS],
        "ordered: true\nsteps:\n- select: [id, qty]\n- join: {right: customers, how: left, predicate: 'qty > limit'}\n- action: dtcs:limit\n  parameters: {count: 100}\n",
    )
    .await;
    fails(
        "colliding_columns",
        &[ORDERS, CUSTOMERS],
        "steps:\n- with_columns: {tier: region}\n- join: {right: customers, 'on': [customer]}\n",
        "ETL006",
    )
    .await;
    same(
        "time_range",
        &[
            ORDERS,
            r#"
  clicks:
    columns: {cid: integer, customer: string, at: timestamp}
    rows:
    - [1, alice, '2024-01-01T10:00:10Z']
    - [2, alice, '2024-01-02T09:00:00Z']
    - [3, bob, '2024-01-01T11:29:00Z']
"#,
        ],
        "steps:\n- join: {right: clicks, 'on': [customer], how: left, time_range: {left: ts, right: at, lower: 30 seconds, upper: 20 minutes}}\n",
    )
    .await;
}

#[tokio::test]
async fn unions() {
    let other = r#"
  more:
    columns: {id: int32, customer: string, amount: float, extra: boolean}
    rows:
    - [10, zoe, 1.25, true]
    - [1, alice, 10.5, null]
"#;
    same(
        "by_name_missing",
        &[ORDERS, other],
        "ordered: true\nsteps:\n- select: [id, customer, amount]\n- union: {other: more, allow_missing: true}\n- action: dtcs:limit\n  parameters: {count: 100}\n",
    )
    .await;
    fails(
        "by_name_refused",
        &[ORDERS, other],
        "steps:\n- select: [id, customer, amount]\n- union: {other: more}\n",
        "ETL206",
    )
    .await;
    same(
        "by_position",
        &[ORDERS, other],
        "ordered: true\nsteps:\n- select: [qty, region, score, paid]\n- union: {other: more, by_name: false}\n- action: dtcs:limit\n  parameters: {count: 100}\n",
    )
    .await;
    same(
        "distinct",
        &[ORDERS, other],
        "ordered: true\nsteps:\n- select: [customer]\n- union: {other: more, allow_missing: true, distinct: true}\n- action: dtcs:limit\n  parameters: {count: 100}\n",
    )
    .await;
    fails(
        "incompatible",
        &[ORDERS, other],
        "steps:\n- select: [customer, id]\n- union: {other: more, by_name: false, allow_missing: true}\n", "ETL302")
    .await;
}

#[tokio::test]
async fn parameters() {
    same(
        "bound",
        &[ORDERS],
        r#"parameters: {who: bob, n: 2}
steps:
- action: dtcs:filter
  parameters:
    predicate:
      kind: binary
      op: or
      left: {kind: binary, op: eq, left: {kind: fieldRef, target: customer}, right: {kind: fieldRef, scope: parameter, target: who}}
      right: {kind: binary, op: gte, left: {kind: fieldRef, target: qty}, right: {kind: fieldRef, scope: parameter, target: n}}
"#,
    )
    .await;
    fails(
        "missing",
        &[ORDERS],
        r#"steps:
- action: dtcs:filter
  parameters:
    predicate: {kind: binary, op: eq, left: {kind: fieldRef, target: customer}, right: {kind: fieldRef, scope: parameter, target: who}}
"#, "ETL209")
    .await;
}

#[tokio::test]
async fn chained_steps_in_one_region() {
    // Two steps of one region: the second reads the first's result.
    use common::{step_task, tables};
    use etlantic_core::plugin::StepLogic;
    let first = Case::parse(
        "first",
        &case(
            &[ORDERS],
            "steps:\n- filter: 'qty > 0'\n- select: [id, customer, qty]\n",
        ),
    );
    let mut t1 = step_task(&first);
    t1.id = "filtered".into();
    let second = Case::parse(
        "second",
        &case(
            &[r#"
  orders:
    columns: {id: integer, customer: string, qty: integer}
"#],
            "steps:\n- aggregate: {group_by: [customer], aggregates: {q: sum(qty)}}\n",
        ),
    );
    let mut t2 = step_task(&second);
    t2.id = "totals".into();
    t2.inputs = [("orders".to_string(), "filtered".to_string())]
        .into_iter()
        .collect();
    assert!(matches!(t2.logic, StepLogic::Portable { .. }));
    let outputs = ["filtered".to_string(), "totals".to_string()];
    let steps = [t1, t2];
    let p = PolarsBackend
        .execute_batch(&steps, tables(&first), &outputs)
        .await
        .unwrap();
    let d = etlantic_datafusion::DataFusionBackend
        .execute_batch(&steps, tables(&first), &outputs)
        .await
        .unwrap();
    for name in &outputs {
        assert_eq!(p[name].schema, d[name].schema, "{name}");
        assert_eq!(p[name].num_rows(), d[name].num_rows(), "{name}");
    }
}

#[tokio::test]
async fn refusals_are_declared() {
    // What the backend does not implement is refused while planning with ETL501.
    for (name, steps) in [
        (
            "window",
            "steps:\n- window_aggregate: {window: {type: tumbling, column: ts, size: 1 hour}, aggregates: {n: count_all()}}\n",
        ),
        ("decimal_division", "steps:\n- with_columns: {x: amount / 2}\n"),
        ("date_function", "steps:\n- with_columns: {x: \"date_trunc(ts, 'day')\"}\n"),
    ] {
        let c = Case::parse(name, &case(&[ORDERS], steps));
        match compare(&c).await {
            Outcome::Unsupported(why) => assert!(why.starts_with("ETL501"), "{name}: {why}"),
            Outcome::Same => {}
            other => panic!("{name}: {other:?}"),
        }
    }
    let caps = PolarsBackend.capabilities();
    assert!(!caps.supports_action("dtcs:explode"));
    assert!(!caps.supports_function("dtcs:date_trunc"));
}

#[test]
fn every_declared_function_and_action_is_exercised_here() {
    let source = include_str!("polars_backend.rs");
    let caps = PolarsBackend.capabilities();
    for f in &caps.functions {
        let short = f.strip_prefix("dtcs:").unwrap();
        assert!(
            source.contains(&format!("{short}(")) || source.contains(f.as_str()),
            "no test uses {f}"
        );
    }
    assert_eq!(
        caps.region_kinds,
        vec![etlantic_core::plugin::RegionKind::Batch]
    );
    assert_eq!(PolarsBackend.name(), "polars");
    assert!(etlantic_core::plugin::backends().any(|b| b.name() == "polars"));
}

/// Generated tables (a few hundred rows, many nulls and duplicate keys) through a set of
/// pipelines that exercise order, grouping and joining at a size where Polars runs in
/// parallel.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generated_tables() {
    let mut seed: u64 = 42;
    let mut next = |m: u64| {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (seed >> 33) % m
    };
    let mut facts = String::from(
        "\n  facts:\n    columns: {id: integer, k: integer, g: string, v: 'decimal(12,3)', f: float, b: boolean, t: timestamp}\n    rows:\n",
    );
    for id in 0..400 {
        let k = if next(10) == 0 {
            "null".to_string()
        } else {
            next(25).to_string()
        };
        let g = match next(6) {
            0 => "null".to_string(),
            n => format!("g{n}"),
        };
        let v = if next(8) == 0 {
            "null".to_string()
        } else {
            format!("'{}.{:03}'", next(2000) as i64 - 1000, next(1000))
        };
        let f = if next(9) == 0 {
            "null".to_string()
        } else {
            format!("{}", (next(4000) as f64 - 2000.0) / 8.0)
        };
        let b = ["true", "false", "null"][next(3) as usize];
        let t = if next(7) == 0 {
            "null".to_string()
        } else {
            format!("'2024-01-{:02}T{:02}:00:00Z'", 1 + next(28), next(24))
        };
        facts.push_str(&format!("    - [{id}, {k}, {g}, {v}, {f}, {b}, {t}]\n"));
    }
    let mut dims =
        String::from("\n  dims:\n    columns: {k: integer, name: string, w: integer}\n    rows:\n");
    for i in 0..40 {
        let k = if i % 13 == 0 {
            "null".to_string()
        } else {
            (i % 30).to_string()
        };
        dims.push_str(&format!("    - [{k}, n{}, {}]\n", i, next(100)));
    }
    let inputs = [facts.as_str(), dims.as_str()];
    let pipelines: &[(&str, &str)] = &[
        (
            "float_sums",
            "steps:\n- with_columns: {f: 'f / 10 + 0.1'}\n- aggregate: {group_by: [g], aggregates: {s: sum(f), a: average(f)}}\n",
        ),
        (
            "float_sums_global",
            "tolerance: 1e-12\nsteps:\n- with_columns: {f: 'f / 10 + 0.1'}\n- aggregate: {aggregates: {s: sum(f), a: average(f), ai: average(id * 1000000007)}}\n",
        ),
        ("sort_all", "ordered: true\nsteps:\n- sort: [{expr: g, nulls: first}, {expr: v, descending: true}, b]\n"),
        ("sort_limit", "ordered: true\nsteps:\n- sort: [k]\n- action: dtcs:limit\n  parameters: {count: 50, offset: 17}\n"),
        (
            "group",
            "steps:\n- aggregate: {group_by: [g, b], aggregates: {n: count_all(), c: count(v), d: count_distinct(k), s: sum(v), a: average(v), af: average(k), mi: min(t), ma: max(f), fi: first(v), la: last(f)}}\n",
        ),
        (
            "group_after_sort",
            "steps:\n- sort: [{expr: f, descending: true}]\n- aggregate: {group_by: [k], aggregates: {fi: first(id), la: last(id), s: sum(k)}}\n",
        ),
        ("dedup_last", "ordered: true\nsteps:\n- action: dtcs:deduplicate\n  parameters: {keys: [k, g], retain: last}\n- action: dtcs:limit\n  parameters: {count: 1000}\n"),
        ("distinct", "ordered: true\nsteps:\n- select: [g, b]\n- distinct: true\n- action: dtcs:limit\n  parameters: {count: 1000}\n"),
        ("join_left", "ordered: true\nsteps:\n- join: {right: dims, 'on': [k], how: left}\n- action: dtcs:limit\n  parameters: {count: 10000}\n"),
        ("join_full_ns", "ordered: true\nsteps:\n- join: {right: dims, 'on': [k], how: full, null_safe: true}\n- action: dtcs:limit\n  parameters: {count: 10000}\n"),
        (
            "join_right_predicate",
            "ordered: true\nsteps:\n- join: {right: dims, 'on': [k], how: right, predicate: 'w > id % 100 || b'}\n- action: dtcs:limit\n  parameters: {count: 10000}\n",
        ),
        ("join_anti", "ordered: true\nsteps:\n- join: {right: dims, 'on': [k], how: anti}\n- action: dtcs:limit\n  parameters: {count: 10000}\n"),
        (
            "union_distinct",
            "ordered: true\nsteps:\n- select: [k]\n- union: {other: dims, allow_missing: true, distinct: true}\n- action: dtcs:limit\n  parameters: {count: 10000}\n",
        ),
        (
            "expressions",
            "steps:\n- with_columns: {x: 'case_when(k > 10, v * k, k > 5, v + 1, v - k)', y: 'round(f * 1.5, 1)', z: 'coalesce(g, ''none'') + ''/'' + substr(coalesce(g, ''?''), 1)', w: 'k * k - id % 7', u: 'between(f, -10, 10) || !b'}\n- filter: 'x > 0 || y < 0 || is_null(u)'\n",
        ),
    ];
    for (name, rest) in pipelines {
        let c = Case::parse(name, &case(&inputs, rest));
        match compare(&c).await {
            Outcome::Same => {}
            other => panic!("{name}: {other:?}"),
        }
    }
}

/// Plans written as documents (ETLantic-py's chained dialect) with the field actions and
/// the action aliases the IR decodes.
#[tokio::test]
async fn field_actions_and_aliases_in_plan_documents() {
    use etlantic_core::ir::TransformPlan;
    use etlantic_core::plugin::{StepLogic, StepTask};
    use serde_json::{json, Value};
    use std::sync::Arc;
    fn node(id: &str, action: &str, target: &str, params: Value) -> Value {
        json!({"id": id, "kind": {"action": action, "id": id, "kind": "semanticAction", "parameters": params, "target": target}, "objectRef": format!("semanticActions.{id}")})
    }
    let plan = json!({
        "planIdentity": "dtcs.transform-plan/2", "profile": "dtcs:profile/portable-relational/2",
        "specificationVersion": "3.0.0", "transformation": "t",
        "inputs": {"orders": {"id": "orders", "optional": false}},
        "actions": [
            node("a1", "dtcs:select", "orders", json!({"predicate": "qty >= 1"})),
            node("a2", "dtcs:uppercase", "a1.customer", json!({})),
            node("a3", "dtcs:lowercase", "a2.region", json!({})),
            node("a4", "dtcs:trim", "a3.customer", json!({})),
            node("a5", "dtcs:group", "a4", json!({"groupBy": ["customer", "region"], "aggregates": [{"as": "n", "op": "count_all"}]})),
        ],
        "outputs": {"result": {"id": "result"}},
        "requirements": {"dependencies": [{"from": "a5", "to": "result", "reason": "lineage"}]},
        "errorMode": "fail"
    });
    let plan = TransformPlan::from_value(&plan, "plan.json").unwrap();
    let (actions, _) = plan.decoded().registry_ids();
    let caps = PolarsBackend.capabilities();
    for a in &actions {
        assert!(caps.supports_action(a), "{a}");
    }
    let task = StepTask {
        id: "result".into(),
        inputs: [("orders".to_string(), "orders".to_string())]
            .into_iter()
            .collect(),
        logic: StepLogic::Portable {
            plan: Arc::new(plan),
            parameters: Default::default(),
            output: "result".into(),
        },
    };
    let c = Case::parse("document", &case(&[ORDERS], "steps: []\n"));
    let tables = common::tables(&c);
    let reference = common::run_task(
        &etlantic_datafusion::DataFusionBackend,
        task.clone(),
        tables.clone(),
    )
    .await;
    let polars = common::run_task(&PolarsBackend, task, tables).await;
    assert_eq!(common::compare_runs(&c, reference, polars), Outcome::Same);
}

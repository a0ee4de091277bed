//! The runtime's quality gates with the embedded engine linked (it runs the contracts'
//! `sql` rules): every rule kind measured under every policy.

use arrow::array::{Array, AsArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow::datatypes::{DataType, Field, Schema};
use etlantic_core::contract::rules::{Policy, RuleSet};
use etlantic_core::contract::Contract;
use etlantic_core::data::{SourcePosition, Table};
use etlantic_runtime::quality::{GateOutcome, QualityGate, RuleCount};
use indexmap::IndexMap;
use std::sync::Arc;

const ORDERS: &str = r#"
version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    quality:
      - metric: rowCount
        mustBeGreaterThan: 0
      - id: positive_total
        type: sql
        query: "SELECT COUNT(*) FROM orders WHERE amount < 0"
        mustBeLessOrEqualTo: 1
    properties:
      - name: "id"
        logicalType: "integer"
        unique: true
      - name: "amount"
        logicalType: "number"
        logicalTypeOptions: {minimum: 0, maximum: 100}
      - name: "status"
        logicalType: "string"
        quality:
          - id: known
            metric: invalidValues
            arguments: {validValues: [new, paid]}
            mustBe: 0
      - name: "customer"
        logicalType: "string"
        logicalTypeOptions: {pattern: "[a-z]+"}
        quality:
          - id: mostly_known
            metric: nullValues
            unit: percent
            mustBeLessThan: 30
"#;

fn table() -> Table {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("amount", DataType::Float64, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("customer", DataType::Utf8, true),
    ]));
    let batch = |ids: Vec<i64>,
                 amounts: Vec<Option<f64>>,
                 status: Vec<Option<&str>>,
                 customers: Vec<Option<&str>>| {
        RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int64Array::from(ids)),
                Arc::new(Float64Array::from(amounts)),
                Arc::new(StringArray::from(status)),
                Arc::new(StringArray::from(customers)),
            ],
        )
        .unwrap()
    };
    Table::new(
        schema.clone(),
        vec![
            batch(
                vec![1, 2, 3],
                vec![Some(10.0), Some(-5.0), None],
                vec![Some("new"), Some("paid"), Some("lost")],
                vec![Some("ann"), Some("Bob"), None],
            ),
            // Row 3 repeats id 1 (a duplicate across the batch's Arrow batches).
            batch(
                vec![1, 4],
                vec![Some(150.0), Some(20.0)],
                vec![None, Some("new")],
                vec![Some("cy"), Some("dee")],
            ),
        ],
    )
}

fn gate(policies: &[(&str, Policy)], decoded: bool) -> QualityGate {
    etlantic_datafusion::link();
    let c = Contract::parse(ORDERS, "orders.yaml", None).unwrap();
    let rules = RuleSet::of(&c).unwrap();
    let policies = policies.iter().map(|(k, v)| (k.to_string(), *v)).collect();
    QualityGate::new(
        "orders",
        "orders",
        &rules,
        table().schema,
        &policies,
        Policy::Quarantine,
        decoded,
    )
    .unwrap()
    .unwrap()
}

fn position(row: usize) -> SourcePosition {
    SourcePosition {
        asset: "orders".into(),
        row: Some(row as u64),
        ..SourcePosition::default()
    }
}

fn count<'a>(out: &'a GateOutcome, id: &str) -> &'a RuleCount {
    out.counts.iter().find(|c| c.id == id).unwrap()
}

#[tokio::test]
async fn every_rule_is_measured_and_each_policy_applied() {
    let g = gate(
        &[
            ("orders.amount.range", Policy::Drop),
            ("orders.customer.pattern", Policy::Warn),
        ],
        false,
    );
    let out = g.apply(table(), &position).await.unwrap();
    // amount: -5 (row 1) and 150 (row 3) are out of range; null passes. Dropped.
    let range = count(&out, "orders.amount.range");
    assert_eq!(
        (range.violations, range.failed, range.removed),
        (2, true, 2)
    );
    // status `lost` (row 2) is invalid; null passes. Quarantined (on_error default).
    let known = count(&out, "orders.status.known");
    assert_eq!((known.violations, known.policy), (1, Policy::Quarantine));
    // id 1 again in row 3: a duplicate, quarantined.
    assert_eq!(count(&out, "orders.id.unique").violations, 1);
    // `Bob` breaks the pattern; warned, kept.
    let pattern = count(&out, "orders.customer.pattern");
    assert_eq!((pattern.violations, pattern.removed), (1, 0));
    // 1 null customer of 5 = 20 % < 30 %: passes.
    let nulls = count(&out, "orders.customer.mostly_known");
    assert_eq!((nulls.measure, nulls.failed), (20.0, false));
    assert_eq!(count(&out, "orders.quality[0]").measure, 5.0);
    let sql = count(&out, "orders.positive_total");
    assert_eq!((sql.measure, sql.failed), (1.0, false));
    // Kept: rows 0 and 4 (row 1 dropped, 2 quarantined, 3 dropped and quarantined).
    let ids: Vec<i64> = out
        .table
        .batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_primitive::<arrow::datatypes::Int64Type>()
                .values()
                .to_vec()
        })
        .collect();
    assert_eq!(ids, [1, 4]);
    assert_eq!(out.dropped, 1);
    let q: Vec<(u64, &str)> = out
        .quarantined
        .iter()
        .map(|r| (r.position.row.unwrap(), r.reason.as_str()))
        .collect();
    assert_eq!(q.len(), 2, "{q:?}");
    assert_eq!(q[0].0, 2);
    assert!(q[0].1.contains("orders.status.known") && q[0].1.contains("status=lost"));
    // Row 3 broke the range (drop) and uniqueness (quarantine): quarantined once,
    // with both reasons.
    assert_eq!(q[1].0, 3);
    assert!(q[1].1.contains("orders.amount.range") && q[1].1.contains("orders.id.unique"));
    assert_eq!(out.quarantined[1].code, "ETL704");
    assert!(out.quarantined[1].raw.contains("\"amount\":150"));
}

#[tokio::test]
async fn a_failing_rule_with_the_fail_policy_stops_and_names_every_failure() {
    let g = gate(
        &[
            ("orders.status.known", Policy::Fail),
            ("orders.customer.mostly_known", Policy::Fail),
        ],
        false,
    );
    let e = g.apply(table(), &position).await.unwrap_err();
    assert_eq!(e.code(), "ETL705");
    assert!(e.to_string().contains("orders.status.known"), "{e}");
    assert!(
        !e.to_string().contains("mostly_known"),
        "passing rules do not fail: {e}"
    );
    // An empty batch breaks rowCount > 0; with `fail` it stops, with `warn` it counts.
    let g = gate(&[("orders.quality[0]", Policy::Fail)], false);
    let empty = Table::empty(table().schema);
    assert!(g.apply(empty.clone(), &position).await.is_err());
    let g = gate(&[], false);
    let out = g.apply(empty, &position).await.unwrap();
    let rows = count(&out, "orders.quality[0]");
    assert_eq!(
        (rows.failed, rows.violations, rows.policy),
        (true, 1, Policy::Warn)
    );
}

#[tokio::test]
async fn decoded_sources_leave_record_rules_to_the_decoder_and_bad_policies_are_refused() {
    let g = gate(&[], true);
    let ids: Vec<&str> = g.policies().into_iter().map(|(id, _)| id).collect();
    assert!(!ids.contains(&"orders.amount.range"));
    assert!(!ids.contains(&"orders.customer.pattern"));
    assert!(ids.contains(&"orders.id.unique"));
    let c = Contract::parse(ORDERS, "orders.yaml", None).unwrap();
    let rules = RuleSet::of(&c).unwrap();
    let policies = [("orders.quality[0]".to_string(), Policy::Quarantine)]
        .into_iter()
        .collect();
    let e = QualityGate::new(
        "orders",
        "orders",
        &rules,
        table().schema,
        &policies,
        Policy::Quarantine,
        false,
    )
    .unwrap_err();
    assert!(e.to_string().contains("cannot `quarantine`"), "{e}");
}

/// One contract with a single rule of `kind` (its YAML snippet under a property or the
/// object) and its id.
fn single_rule(kind: &str) -> (String, &'static str, &'static str) {
    let (field, snippet, id): (Option<&str>, &str, &str) = match kind {
        "range" => (Some("amount"), "logicalTypeOptions: {minimum: 0}", "orders.amount.range"),
        "length" => (Some("customer"), "logicalTypeOptions: {maxLength: 3}", "orders.customer.length"),
        "pattern" => (Some("customer"), "logicalTypeOptions: {pattern: \"[a-z]+\"}", "orders.customer.pattern"),
        "unique" => (Some("id"), "unique: true", "orders.id.unique"),
        "nullValues" => (Some("status"), "quality: [{id: present, metric: nullValues, mustBe: 0}]", "orders.status.present"),
        "missingValues" => (Some("status"), "quality: [{id: given, metric: missingValues, arguments: {missingValues: [\"n/a\"]}, mustBe: 0}]", "orders.status.given"),
        "invalidValues" => (Some("status"), "quality: [{id: known, metric: invalidValues, arguments: {validValues: [new, paid, \"n/a\"]}, mustBe: 0}]", "orders.status.known"),
        "duplicateValues" => (None, "quality: [{id: one_per_customer, metric: duplicateValues, arguments: {properties: [customer]}, mustBe: 0}]", "orders.one_per_customer"),
        "rowCount" => (None, "quality: [{id: small, metric: rowCount, mustBeLessThan: 3}]", "orders.small"),
        "sql" => (None, "quality: [{id: no_negative, type: sql, query: \"SELECT COUNT(*) FROM orders WHERE amount < 0\", mustBe: 0}]", "orders.no_negative"),
        other => panic!("unknown rule kind {other}"),
    };
    let prop = |name: &str, t: &str| {
        let extra = match field {
            Some(f) if f == name => format!("\n        {snippet}"),
            _ => String::new(),
        };
        format!("      - name: \"{name}\"\n        logicalType: \"{t}\"{extra}\n")
    };
    let object_rules = match field {
        None => format!("    {snippet}\n"),
        Some(_) => String::new(),
    };
    let doc = format!(
        "version: \"1.0.0\"\napiVersion: \"v3.1.0\"\nkind: \"DataContract\"\nid: \"orders\"\nstatus: \"active\"\nschema:\n  - name: \"orders\"\n    logicalType: \"object\"\n{object_rules}    properties:\n{}{}{}{}",
        prop("id", "integer"),
        prop("amount", "number"),
        prop("status", "string"),
        prop("customer", "string"),
    );
    let offending = match kind {
        "range" | "length" | "pattern" => "1",
        "unique" | "nullValues" | "duplicateValues" => "2",
        "missingValues" => "3",
        "invalidValues" => "4",
        _ => "",
    };
    (doc, id, offending)
}

/// Five rows; the comments name the rules each one breaks.
fn matrix_table() -> Table {
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("amount", DataType::Float64, true),
        Field::new("status", DataType::Utf8, true),
        Field::new("customer", DataType::Utf8, true),
    ]));
    let batch = RecordBatch::try_new(
        schema.clone(),
        vec![
            // 0: good; 1: amount < 0, customer too long and not lower case (and the
            // sql count); 2: id and customer repeated, status null; 3: status `n/a`
            // (missing); 4: status `lost` (invalid).
            Arc::new(Int64Array::from(vec![1, 2, 1, 3, 4])),
            Arc::new(Float64Array::from(vec![10.0, -5.0, 20.0, 30.0, 40.0])),
            Arc::new(StringArray::from(vec![
                Some("new"),
                Some("paid"),
                None,
                Some("n/a"),
                Some("lost"),
            ])),
            Arc::new(StringArray::from(vec!["ann", "Bobby", "ann", "dee", "eve"])),
        ],
    )
    .unwrap();
    Table::new(schema, vec![batch])
}

fn ids(table: &Table) -> Vec<i64> {
    table
        .batches
        .iter()
        .flat_map(|b| {
            b.column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .values()
                .to_vec()
        })
        .collect()
}

#[tokio::test]
async fn every_rule_kind_under_every_policy() {
    let kinds = [
        "range",
        "length",
        "pattern",
        "unique",
        "nullValues",
        "missingValues",
        "invalidValues",
        "duplicateValues",
        "rowCount",
        "sql",
    ];
    let all_ids = ids(&matrix_table());
    for kind in kinds {
        let (doc, id, offending) = single_rule(kind);
        let contract = Contract::parse(&doc, "orders.yaml", None)
            .unwrap_or_else(|e| panic!("{kind}: {e}\n{doc}"));
        let rules = RuleSet::of(&contract).unwrap();
        assert!(
            rules.rules.iter().any(|r| r.id == id),
            "{kind}: rule {id} in {:?}",
            rules.rules
        );
        let points_at_rows = !offending.is_empty();
        let bad: Vec<usize> = offending
            .split(',')
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        for policy in [Policy::Fail, Policy::Drop, Policy::Quarantine, Policy::Warn] {
            let label = format!("{kind} × {}", policy.as_str());
            let policies: IndexMap<String, Policy> = [(id.to_string(), policy)].into();
            let gate = QualityGate::new(
                "orders",
                "orders",
                &rules,
                matrix_table().schema,
                &policies,
                Policy::Quarantine,
                false,
            );
            if !points_at_rows && matches!(policy, Policy::Drop | Policy::Quarantine) {
                let e = gate.expect_err(&label);
                assert_eq!(e.code(), "ETL222", "{label}: {e}");
                continue;
            }
            let gate = gate.unwrap().unwrap();
            let out = gate.apply(matrix_table(), &position).await;
            if policy == Policy::Fail {
                let e = out.expect_err(&label);
                assert_eq!(e.code(), "ETL705", "{label}");
                assert!(e.to_string().contains(id), "{label}: {e}");
                continue;
            }
            let out = out.unwrap();
            let c = count(&out, id);
            assert!(c.failed, "{label}: the rule fails on this table");
            assert_eq!(c.policy, policy, "{label}");
            let kept = ids(&out.table);
            let expected_kept: Vec<i64> = all_ids
                .iter()
                .enumerate()
                .filter(|(i, _)| policy == Policy::Warn || !bad.contains(i))
                .map(|(_, v)| *v)
                .collect();
            assert_eq!(kept, expected_kept, "{label}: rows that go on");
            match policy {
                Policy::Drop => {
                    assert_eq!(
                        (out.dropped, out.quarantined.len()),
                        (bad.len() as u64, 0),
                        "{label}"
                    );
                    assert_eq!(c.removed, bad.len() as u64, "{label}");
                }
                Policy::Quarantine => {
                    assert_eq!(out.dropped, 0, "{label}");
                    let rows: Vec<u64> = out
                        .quarantined
                        .iter()
                        .map(|r| r.position.row.unwrap())
                        .collect();
                    assert_eq!(
                        rows,
                        bad.iter().map(|&b| b as u64).collect::<Vec<_>>(),
                        "{label}"
                    );
                    for r in &out.quarantined {
                        assert_eq!(r.code, "ETL704", "{label}");
                        assert!(r.reason.contains(id), "{label}: {}", r.reason);
                        assert!(r.raw.starts_with('{'), "{label}: {}", r.raw);
                    }
                }
                Policy::Warn => {
                    assert_eq!(
                        (out.dropped, out.quarantined.len(), c.removed),
                        (0, 0, 0),
                        "{label}"
                    );
                    if points_at_rows {
                        assert_eq!(c.violations, bad.len() as u64, "{label}");
                    }
                }
                Policy::Fail => unreachable!(),
            }
        }
    }
}

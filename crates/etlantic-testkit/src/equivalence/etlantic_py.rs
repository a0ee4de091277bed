//! ETLantic-py's portable conformance corpus, run on our backends.
//!
//! `tests/fixtures/etlantic-py-corpus.json` holds the cases ETLantic-py 0.59 hands its
//! own compilers (`etlantic.testing.portable_fixtures.FIXTURES`, exported by
//! `scripts/etlantic_py_fixtures.py --corpus`): a bare `dtcs.transform-plan/2` dict (no
//! envelope), input rows per plan input, and either ETLantic-py's expected rows or the
//! requirement a compiler must refuse the plan for. [`run_py_case`] runs one case on one
//! batch backend exactly as a pipeline's portable step would run: the plan loaded with
//! [`TransformPlan::from_value`], checked against what the backend declares, its schema
//! promised by `output_schema`, executed by `execute_batch`.
//!
//! Rows compare as ETLantic-py's suite compares them (`normalize_rows` and
//! `_semantically_equal`): as JSON objects, in order only when the plan sorts, a boolean
//! never equal to a number, integers and floats equal when their values are.

use super::runner::{BackendUnderTest, Outcome, Target};
use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use etlantic_core::data::Table;
use etlantic_core::diagnostics::Error;
use etlantic_core::ir::TransformPlan;
use etlantic_core::plugin::{Backend, RegionKind, StepLogic, StepTask};
use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One case of the corpus.
#[derive(Clone, Debug, Deserialize)]
pub struct PyCase {
    /// The case name.
    pub name: String,
    /// The plan, as ETLantic-py hands it to a compiler.
    pub plan: Value,
    /// Rows per plan input.
    pub inputs: IndexMap<String, Vec<Map<String, Value>>>,
    /// Parameter values.
    #[serde(default)]
    pub parameters: IndexMap<String, Value>,
    /// ETLantic-py's rows (absent when the plan must be refused).
    #[serde(default)]
    pub expected: Option<Vec<Map<String, Value>>>,
    /// Whether a compiler must refuse the plan.
    #[serde(default)]
    pub expect_unsupported: bool,
    /// What the refusal must name (e.g. `collisionPolicy`).
    #[serde(default)]
    pub unsupported_requirement_substr: Option<String>,
    /// Whether rows compare in order (the plan sorts).
    #[serde(default)]
    pub ordered: bool,
}

#[derive(Deserialize)]
struct Corpus {
    cases: Vec<PyCase>,
}

/// The corpus file of this repository.
pub fn corpus_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/etlantic-py-corpus.json")
}

/// Reads the corpus at `path`.
pub fn load_corpus(path: &Path) -> Result<Vec<PyCase>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let corpus: Corpus =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(corpus.cases)
}

fn first_error(e: &Error) -> String {
    e.diagnostics()
        .iter()
        .find(|d| d.is_error())
        .map(|d| {
            if d.path.is_empty() {
                format!("{}: {}", d.code, d.message)
            } else {
                format!("{}: {} (at {})", d.code, d.message, d.path)
            }
        })
        .unwrap_or_else(|| e.to_string())
}

/// Runs `case` on a batch backend. A case that must be refused passes when the plan is
/// refused at loading or planning with a diagnostic naming the requirement; running it,
/// or refusing it for another reason, fails.
pub async fn run_py_case(case: &PyCase, backend: &BackendUnderTest) -> Outcome {
    let Target::Batch(b) = &backend.target else {
        return Outcome::Unsupported("the corpus runs on batch backends".into());
    };
    let got = execute(case, b.as_ref()).await;
    if case.expect_unsupported {
        let need = case
            .unsupported_requirement_substr
            .clone()
            .unwrap_or_default();
        return match got {
            Err(Refusal::Declared(why) | Refusal::Failed(why))
                if names_requirement(&why, &need) =>
            {
                Outcome::Pass
            }
            Err(Refusal::Declared(why) | Refusal::Failed(why)) => {
                Outcome::Fail(format!("refused, but not for `{need}`: {why}"))
            }
            Ok(_) => Outcome::Fail(format!("ran a plan that must be refused for `{need}`")),
        };
    }
    match got {
        Ok(rows) => {
            let expected = case.expected.clone().unwrap_or_default();
            compare_rows(&rows, &expected, case.ordered)
                .map(|()| Outcome::Pass)
                .unwrap_or_else(Outcome::Fail)
        }
        Err(Refusal::Declared(why)) => Outcome::Unsupported(why),
        Err(Refusal::Failed(why)) => Outcome::Fail(why),
    }
}

/// Whether a refusal names `requirement` (`window_frame` is also `window frame`).
fn names_requirement(why: &str, requirement: &str) -> bool {
    let why = why.to_lowercase();
    let r = requirement.to_lowercase();
    why.contains(&r) || why.contains(&r.replace('_', " "))
}

enum Refusal {
    /// Refused by what the backend declares (`ETL5xx`).
    Declared(String),
    /// Anything else: a load error, a planning error, an execution error.
    Failed(String),
}

fn refused(e: &Error) -> Refusal {
    let declared = e
        .diagnostics()
        .iter()
        .filter(|d| d.is_error())
        .all(|d| d.code.starts_with("ETL5"));
    if declared {
        Refusal::Declared(first_error(e))
    } else {
        Refusal::Failed(first_error(e))
    }
}

async fn execute(case: &PyCase, backend: &dyn Backend) -> Result<Vec<Map<String, Value>>, Refusal> {
    let plan = TransformPlan::from_value(&case.plan, &case.name).map_err(|e| refused(&e))?;
    let output = plan
        .decoded()
        .outputs
        .keys()
        .next()
        .cloned()
        .ok_or_else(|| Refusal::Failed("the plan has no output".into()))?;
    let task = StepTask {
        id: output.clone(),
        inputs: case.inputs.keys().map(|n| (n.clone(), n.clone())).collect(),
        logic: StepLogic::Portable {
            plan: Arc::new(plan),
            parameters: case.parameters.clone(),
            output: output.clone(),
        },
    };
    etlantic_plan::capability::check_step(backend, &task.id, &task.logic, RegionKind::Batch)
        .map_err(|e| refused(&e))?;
    let mut tables = IndexMap::new();
    for (name, rows) in &case.inputs {
        tables.insert(name.clone(), table_of(rows).map_err(Refusal::Failed)?);
    }
    let schemas: IndexMap<String, SchemaRef> = tables
        .iter()
        .map(|(n, t): (&String, &Table)| (n.clone(), t.schema.clone()))
        .collect();
    let promised = backend
        .output_schema(&task, &schemas)
        .map_err(|e| refused(&e))?;
    let mut out = backend
        .execute_batch(
            std::slice::from_ref(&task),
            tables,
            std::slice::from_ref(&output),
        )
        .await
        .map_err(|e| Refusal::Failed(first_error(&e)))?;
    let table = out
        .swap_remove(&output)
        .ok_or_else(|| Refusal::Failed("no result returned".into()))?;
    let same = table.schema.fields().len() == promised.fields().len()
        && table
            .schema
            .fields()
            .iter()
            .zip(promised.fields())
            .all(|(a, b)| a.name() == b.name() && a.data_type() == b.data_type());
    if !same {
        return Err(Refusal::Failed(format!(
            "the result schema {:?} is not the promised {:?}",
            table.schema, promised
        )));
    }
    json_rows(&table).map_err(Refusal::Failed)
}

/// The rows as an Arrow table, each column typed as arrow-json infers it from the values
/// (integers Int64, other numbers Float64, lists and objects nested); a column of nulls
/// only is a nullable string.
pub fn table_of(rows: &[Map<String, Value>]) -> Result<Table, String> {
    let values: Vec<Value> = rows.iter().cloned().map(Value::Object).collect();
    let inferred =
        arrow::json::reader::infer_json_schema_from_iterator(values.iter().map(|v| Ok(v.clone())))
            .map_err(|e| format!("cannot type the input rows: {e}"))?;
    // Columns in the order the rows first name them (inference does not keep it, and a
    // union by position depends on it).
    let mut order: Vec<&String> = Vec::new();
    for r in rows {
        for k in r.keys() {
            if !order.contains(&k) {
                order.push(k);
            }
        }
    }
    let fields: Vec<Field> = order
        .iter()
        .filter_map(|name| inferred.field_with_name(name).ok())
        .map(|f| match f.data_type() {
            DataType::Null => Field::new(f.name(), DataType::Utf8, true),
            _ => f.clone().with_nullable(true),
        })
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let mut decoder = arrow::json::ReaderBuilder::new(schema.clone())
        .build_decoder()
        .map_err(|e| e.to_string())?;
    decoder.serialize(&values).map_err(|e| e.to_string())?;
    let batch: Option<RecordBatch> = decoder.flush().map_err(|e| e.to_string())?;
    Ok(Table::new(schema, batch.into_iter().collect()))
}

/// A table's rows as JSON objects (nulls written out).
pub fn json_rows(table: &Table) -> Result<Vec<Map<String, Value>>, String> {
    let mut buf = Vec::new();
    {
        let mut w = arrow::json::WriterBuilder::new()
            .with_explicit_nulls(true)
            .build::<_, arrow::json::writer::JsonArray>(&mut buf);
        for b in &table.batches {
            w.write(b).map_err(|e| e.to_string())?;
        }
        w.finish().map_err(|e| e.to_string())?;
    }
    if buf.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<Map<String, Value>> =
        serde_json::from_slice(&buf).map_err(|e| format!("the result as JSON: {e}"))?;
    Ok(rows)
}

/// ETLantic-py's `_semantically_equal` on normalised values.
fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Bool(x), Value::Bool(y)) => x == y,
        (Value::Bool(_), _) | (_, Value::Bool(_)) => false,
        (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
            (Some(i), Some(j)) => i == j,
            _ => x.as_f64() == y.as_f64(),
        },
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b))
        }
        (Value::Object(x), Value::Object(y)) => same_row(x, y),
        (x, y) => x == y,
    }
}

fn same_row(a: &Map<String, Value>, b: &Map<String, Value>) -> bool {
    a.len() == b.len()
        && a.iter()
            .all(|(k, v)| b.get(k).is_some_and(|w| same_value(v, w)))
}

/// A sort key that equal values share (numbers by value, so `2` and `2.0` sort alike).
fn sort_key(row: &Map<String, Value>) -> String {
    fn key(v: &Value) -> String {
        match v {
            Value::Number(n) => format!("n{:e}", n.as_f64().unwrap_or(f64::NAN)),
            Value::Array(a) => format!("[{}]", a.iter().map(key).collect::<Vec<_>>().join(",")),
            Value::Object(m) => format!("{{{}}}", sort_key(m)),
            other => other.to_string(),
        }
    }
    let mut keys: Vec<&String> = row.keys().collect();
    keys.sort();
    keys.iter()
        .map(|k| format!("{k}={}", key(&row[*k])))
        .collect::<Vec<_>>()
        .join("\u{1}")
}

/// Compares result rows with ETLantic-py's, in order when `ordered`.
pub fn compare_rows(
    got: &[Map<String, Value>],
    expected: &[Map<String, Value>],
    ordered: bool,
) -> Result<(), String> {
    let mut g: Vec<&Map<String, Value>> = got.iter().collect();
    let mut e: Vec<&Map<String, Value>> = expected.iter().collect();
    if !ordered {
        g.sort_by_key(|r| sort_key(r));
        e.sort_by_key(|r| sort_key(r));
    }
    if g.len() == e.len() && g.iter().zip(&e).all(|(a, b)| same_row(a, b)) {
        return Ok(());
    }
    let show = |rows: &[&Map<String, Value>]| {
        rows.iter()
            .map(|r| Value::Object((*r).clone()).to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    Err(format!(
        "rows differ\n    expected {}\n    got      {}",
        show(&e),
        show(&g)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rows(v: Value) -> Vec<Map<String, Value>> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn rows_compare_as_etlantic_py_compares_them() {
        let a = rows(json!([{"k": "a", "v": 2}, {"k": "b", "v": 1.5}]));
        let b = rows(json!([{"v": 1.5, "k": "b"}, {"k": "a", "v": 2.0}]));
        assert!(compare_rows(&a, &b, false).is_ok());
        assert!(
            compare_rows(&a, &b, true).is_err(),
            "in order, the rows differ"
        );
        let flag = rows(json!([{"x": true}]));
        let one = rows(json!([{"x": 1}]));
        assert!(compare_rows(&flag, &one, false).is_err(), "true is not 1");
        let missing = rows(json!([{"k": "a"}]));
        let null = rows(json!([{"k": "a", "v": null}]));
        assert!(compare_rows(&missing, &null, false).is_err());
        assert!(compare_rows(&a, &a[..1], false).is_err());
    }

    #[test]
    fn input_rows_become_typed_columns_and_come_back() {
        let input = rows(json!([
            {"i": 1, "f": 1.5, "s": "x", "b": true, "n": null, "l": [1, 2], "o": {"a": 1}},
            {"i": null, "f": 2, "s": null, "b": null, "n": null, "l": [], "o": null}
        ]));
        let t = table_of(&input).unwrap();
        let types: Vec<DataType> = t
            .schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        assert_eq!(types[0], DataType::Int64);
        assert_eq!(types[1], DataType::Float64);
        assert_eq!(types[4], DataType::Utf8, "a column of nulls");
        let back = json_rows(&t).unwrap();
        assert!(compare_rows(&back, &input, true).is_ok(), "{back:?}");
    }
}

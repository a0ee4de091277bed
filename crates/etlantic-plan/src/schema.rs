//! Schema compatibility: does the data flowing into a port or sink fit the contract it
//! declares?
//!
//! A schema fits a contract when it has exactly the contract's columns (any order) and
//! each column's type converts to the contract's type without loss: the same type, a
//! wider integer, an integer or narrower float into a float, any string encoding into a
//! string, a timestamp with the same time-zone semantics. Nullability is not compared
//! here: whether a nullable column actually holds nulls is a record-level check.

use arrow::datatypes::{DataType, Schema, SchemaRef};
use etlantic_core::diagnostics::{codes, Diagnostic, Result};
use etlantic_core::ir::types::dtcs_type;
use etlantic_core::ir::TransformPlan;
use indexmap::IndexMap;

/// The outcome of a compatibility check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compatibility {
    /// The schema fits.
    Compatible,
    /// What does not fit, one entry per column.
    Incompatible(Vec<String>),
}

fn int_width(dt: &DataType) -> Option<(bool, u8)> {
    Some(match dt {
        DataType::Int8 => (true, 8),
        DataType::Int16 => (true, 16),
        DataType::Int32 => (true, 32),
        DataType::Int64 => (true, 64),
        DataType::UInt8 => (false, 8),
        DataType::UInt16 => (false, 16),
        DataType::UInt32 => (false, 32),
        DataType::UInt64 => (false, 64),
        _ => return None,
    })
}

fn is_string(dt: &DataType) -> bool {
    matches!(
        dt,
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
    )
}

fn is_utc(tz: &Option<std::sync::Arc<str>>) -> Option<bool> {
    tz.as_deref()
        .map(|z| matches!(z, "UTC" | "+00:00" | "Z" | "Etc/UTC"))
}

/// Whether values of `actual` convert to `expected` without loss.
pub fn type_fits(actual: &DataType, expected: &DataType) -> bool {
    if actual == expected || *actual == DataType::Null {
        return true;
    }
    match (actual, expected) {
        (a, e) if is_string(a) && is_string(e) => true,
        (a, e) if int_width(a).is_some() && int_width(e).is_some() => {
            let (sa, wa) = int_width(a).expect("int");
            let (se, we) = int_width(e).expect("int");
            (sa == se && wa <= we) || (!sa && se && wa < we)
        }
        (a, DataType::Float64) if int_width(a).is_some() || *a == DataType::Float32 => true,
        (DataType::Timestamp(_, ta), DataType::Timestamp(_, te)) => {
            is_utc(ta) == is_utc(te) && (ta.is_none() == te.is_none())
        }
        (DataType::Decimal128(pa, sa), DataType::Decimal128(pe, se)) => sa == se && pa <= pe,
        (DataType::List(a), DataType::List(e)) => type_fits(a.data_type(), e.data_type()),
        (DataType::Struct(a), DataType::Struct(e)) => {
            a.len() == e.len()
                && e.iter().all(|fe| {
                    a.iter().any(|fa| {
                        fa.name() == fe.name() && type_fits(fa.data_type(), fe.data_type())
                    })
                })
        }
        _ => false,
    }
}

/// Checks that `actual` fits the contract schema `expected`.
pub fn check_compatible(actual: &Schema, expected: &Schema) -> Compatibility {
    let mut problems = Vec::new();
    for e in expected.fields() {
        match actual.field_with_name(e.name()) {
            Err(_) => problems.push(format!("missing column `{}` ({})", e.name(), e.data_type())),
            Ok(a) if !type_fits(a.data_type(), e.data_type()) => problems.push(format!(
                "column `{}` is {} but the contract says {}",
                e.name(),
                a.data_type(),
                e.data_type()
            )),
            Ok(_) => {}
        }
    }
    for a in actual.fields() {
        if expected.field_with_name(a.name()).is_err() {
            problems.push(format!(
                "unexpected column `{}` ({})",
                a.name(),
                a.data_type()
            ));
        }
    }
    if problems.is_empty() {
        Compatibility::Compatible
    } else {
        Compatibility::Incompatible(problems)
    }
}

/// Checks the fields a DTCS plan declares on its inputs against the schemas that flow in.
/// A declared `decimal` accepts integers; otherwise the DTCS types must be equal.
pub fn check_plan_inputs(
    plan: &TransformPlan,
    inputs: &IndexMap<String, SchemaRef>,
    transform: &str,
) -> Result<()> {
    let mut problems = Vec::new();
    for input in &plan.decoded().inputs {
        let Some(schema) = inputs.get(&input.id) else {
            continue;
        };
        for f in &input.fields {
            match schema.field_with_name(&f.name) {
                Err(_) => problems.push(format!("input `{}` has no column `{}`", input.id, f.name)),
                Ok(a) => {
                    let actual = dtcs_type(a.data_type());
                    let ok =
                        actual == f.dtcs_type || (f.dtcs_type == "decimal" && actual == "integer");
                    if !ok {
                        problems.push(format!(
                            "column `{}.{}` is {actual} but the plan declares {}",
                            input.id, f.name, f.dtcs_type
                        ));
                    }
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Diagnostic::new(
            &codes::PORT_TYPE_MISMATCH,
            format!(
                "the inputs of `{transform}` do not match its plan: {}",
                problems.join("; ")
            ),
        )
        .at(format!("transforms[{transform}].inputs"))
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{Field, TimeUnit};

    #[test]
    fn widening_is_fine_narrowing_is_not() {
        assert!(type_fits(&DataType::Int32, &DataType::Int64));
        assert!(!type_fits(&DataType::Int64, &DataType::Int32));
        assert!(type_fits(&DataType::Int64, &DataType::Float64));
        assert!(!type_fits(&DataType::Float64, &DataType::Int64));
        assert!(type_fits(&DataType::Utf8View, &DataType::Utf8));
        assert!(type_fits(
            &DataType::Timestamp(TimeUnit::Millisecond, Some("+00:00".into())),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        ));
        assert!(!type_fits(
            &DataType::Timestamp(TimeUnit::Microsecond, None),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        ));
    }

    #[test]
    fn reports_every_problem() {
        let a = Schema::new(vec![
            Field::new("x", DataType::Utf8, true),
            Field::new("extra", DataType::Int64, true),
        ]);
        let e = Schema::new(vec![
            Field::new("x", DataType::Int64, false),
            Field::new("y", DataType::Int64, true),
        ]);
        match check_compatible(&a, &e) {
            Compatibility::Incompatible(p) => assert_eq!(p.len(), 3, "{p:?}"),
            _ => panic!(),
        }
    }
}

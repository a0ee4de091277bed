//! ODCS v3 data contracts: loading and checking them with the `odcs` crate, and the Arrow
//! view of their schema ([`types`] is the one place where ODCS types map to Arrow).

pub mod rules;
pub mod types;

use crate::diagnostics::{codes, Diagnostic, Diagnostics, Error, Result};
use arrow::datatypes::{Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

pub use odcs::DataContract;

/// Record-level constraints of a field, taken from ODCS `logicalTypeOptions`.
///
/// Arrow cannot hold these; sources and validators check them per record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FieldConstraints {
    /// Inclusive lower bound (numbers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minimum: Option<f64>,
    /// Inclusive upper bound (numbers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum: Option<f64>,
    /// Exclusive lower bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_minimum: Option<f64>,
    /// Exclusive upper bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_maximum: Option<f64>,
    /// Minimum string length in characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_length: Option<u64>,
    /// Maximum string length in characters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_length: Option<u64>,
    /// A regular expression the whole string must match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pattern: Option<String>,
}

impl FieldConstraints {
    /// Whether no constraint is set.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// One column of a contract, in Arrow terms.
#[derive(Clone, Debug, PartialEq)]
pub struct ContractField {
    /// The Arrow field (name, type, nullability = not `required`).
    pub field: Field,
    /// Whether the field is required (non-null and present).
    pub required: bool,
    /// Whether values must be unique.
    pub unique: bool,
    /// Whether the field is part of the primary key.
    pub primary_key: bool,
    /// Value constraints.
    pub constraints: FieldConstraints,
}

/// A loaded and validated ODCS data contract, bound to one of its schema objects.
#[derive(Clone, Debug)]
pub struct Contract {
    /// The ODCS document as parsed.
    pub document: DataContract,
    /// The name of the schema object this contract describes (the first one unless a
    /// `#object` suffix chose another).
    pub object: String,
    /// The columns of that schema object.
    pub fields: Vec<ContractField>,
    schema: SchemaRef,
}

impl Contract {
    /// Parses and validates an ODCS YAML or JSON document. `origin` names it in diagnostics.
    pub fn parse(text: &str, origin: &str, object: Option<&str>) -> Result<Self> {
        let format = if text.trim_start().starts_with('{') {
            odcs::DocumentFormat::Json
        } else {
            odcs::DocumentFormat::Yaml
        };
        let document = odcs::parse_strict(text.as_bytes(), format)
            .map_err(|report| odcs_report_to_error(&report, origin))?;
        Self::from_document(document, origin, object)
    }

    /// Loads a contract file. A `#object` suffix on the path selects a schema object.
    pub fn load(path_and_object: &Path, origin: &str) -> Result<Self> {
        let text = path_and_object.to_string_lossy();
        let (path, object) = match text.rsplit_once('#') {
            Some((p, o)) => (Path::new(p).to_path_buf(), Some(o.to_string())),
            None => (path_and_object.to_path_buf(), None),
        };
        let content = std::fs::read_to_string(&path).map_err(|e| {
            Error::from(
                Diagnostic::new(
                    &codes::FILE_UNREADABLE,
                    format!("cannot read contract `{origin}`: {e}"),
                )
                .in_file(origin),
            )
        })?;
        Self::parse(&content, origin, object.as_deref())
    }

    /// Wraps an already validated document.
    pub fn from_document(
        document: DataContract,
        origin: &str,
        object: Option<&str>,
    ) -> Result<Self> {
        let schema_object = match object {
            Some(name) => document
                .schema
                .iter()
                .find(|o| o.name() == Some(name))
                .ok_or_else(|| {
                    Error::from(
                        Diagnostic::new(
                            &codes::UNKNOWN_CONTRACT,
                            format!("contract `{origin}` has no schema object `{name}`"),
                        )
                        .in_file(origin),
                    )
                })?,
            None => document.schema.first().ok_or_else(|| {
                Error::from(
                    Diagnostic::new(
                        &codes::CONTRACT_INVALID,
                        format!("contract `{origin}` has no schema object"),
                    )
                    .in_file(origin)
                    .help("Add a `schema:` entry with `properties:` describing the columns."),
                )
            })?,
        };
        let object = schema_object.name().unwrap_or_default().to_string();
        let mut diags = Diagnostics::new();
        let mut fields = Vec::new();
        for (i, prop) in schema_object.properties.iter().enumerate() {
            let path = format!("schema[{object}].properties[{i}]");
            match types::contract_field(prop) {
                Ok(f) => fields.push(f),
                Err(msg) => diags.push(
                    Diagnostic::new(&codes::UNSUPPORTED_TYPE, msg)
                        .at(path)
                        .in_file(origin),
                ),
            }
        }
        diags.into_result()?;
        let schema = Arc::new(Schema::new(
            fields.iter().map(|f| f.field.clone()).collect::<Vec<_>>(),
        ));
        Ok(Contract {
            document,
            object,
            fields,
            schema,
        })
    }

    /// The Arrow schema of the contract's schema object.
    pub fn arrow_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// The column sets whose values identify a row of the schema object: each `unique`
    /// column on its own, and the primary key's columns together (in declaration order).
    ///
    /// Stateful streaming operators may rely on these across the whole stream (a
    /// stream-stream join keeps no row that has met the one row of a unique key), as
    /// Flink's planner relies on a declared primary key; the join quarantines a
    /// duplicate it still holds the first row of.
    pub fn unique_keys(&self) -> Vec<Vec<String>> {
        let name = |f: &ContractField| f.field.name().clone();
        let mut keys: Vec<Vec<String>> = self
            .fields
            .iter()
            .filter(|f| f.unique)
            .map(|f| vec![name(f)])
            .collect();
        let primary: Vec<String> = self
            .fields
            .iter()
            .filter(|f| f.primary_key)
            .map(name)
            .collect();
        if !primary.is_empty() && !keys.contains(&primary) {
            keys.push(primary);
        }
        keys
    }

    /// The contract's id.
    pub fn id(&self) -> &str {
        &self.document.id
    }

    /// The contract's version.
    pub fn version(&self) -> &str {
        &self.document.version
    }

    /// A field by name.
    pub fn field(&self, name: &str) -> Option<&ContractField> {
        self.fields.iter().find(|f| f.field.name() == name)
    }

    /// The document as canonical JSON (object keys sorted), for embedding in plans.
    pub fn canonical_json(&self) -> Value {
        crate::canonical::canonicalize(
            &serde_json::to_value(&self.document).expect("contracts serialise"),
        )
    }

    /// The document as YAML.
    pub fn to_yaml(&self) -> String {
        serde_yaml::to_string(&self.document).expect("contracts serialise")
    }
}

/// Builds an ODCS v3.1.0 contract describing an Arrow schema (for `etlantic generate`).
pub fn contract_from_schema(id: &str, object: &str, schema: &Schema) -> Result<DataContract> {
    let properties: Vec<Value> = schema
        .fields()
        .iter()
        .map(|f| types::property_from_field(f))
        .collect();
    let doc = serde_json::json!({
        "version": "1.0.0",
        "apiVersion": "v3.1.0",
        "kind": "DataContract",
        "id": sanitize_id(id),
        "name": id,
        "status": "draft",
        "schema": [{"name": object, "logicalType": "object", "properties": properties}],
    });
    let contract: DataContract = serde_json::from_value(doc).map_err(|e| {
        Error::new(
            &codes::CONTRACT_INVALID,
            format!("generated contract is invalid: {e}"),
        )
    })?;
    let report = odcs::validate(&contract);
    if !report.is_valid() {
        return Err(odcs_report_to_error(&report, id));
    }
    Ok(contract)
}

/// ODCS ids allow only `[A-Za-z0-9_-]`.
pub fn sanitize_id(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn odcs_report_to_error(report: &odcs::DiagnosticReport, origin: &str) -> Error {
    let mut diags = Diagnostics::new();
    for d in report.errors() {
        let mut diag = Diagnostic::new(
            &codes::CONTRACT_INVALID,
            format!("{origin}: {} [{}]", d.message, d.id),
        )
        .in_file(origin);
        if let Some(obj) = &d.object_ref {
            diag = diag.at(obj.clone());
        }
        if let Some(rem) = &d.remediation {
            diag = diag.help(rem.clone());
        }
        diags.push(diag);
    }
    if diags.is_empty() {
        diags.push(
            Diagnostic::new(
                &codes::CONTRACT_INVALID,
                format!("{origin}: invalid contract"),
            )
            .in_file(origin),
        );
    }
    Error(diags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, TimeUnit};

    const ORDERS: &str = r#"
version: "1.0.0"
apiVersion: "v3.1.0"
kind: "DataContract"
id: "orders"
status: "active"
schema:
  - name: "orders"
    logicalType: "object"
    properties:
      - name: "order_id"
        logicalType: "integer"
        logicalTypeOptions: {format: i64, minimum: 1}
        required: true
        unique: true
      - name: "customer"
        logicalType: "string"
        logicalTypeOptions: {maxLength: 20}
      - name: "amount"
        logicalType: "number"
        physicalType: "decimal(12,2)"
      - name: "ts"
        logicalType: "timestamp"
      - name: "tags"
        logicalType: "array"
        items: {name: "tag", logicalType: "string"}
"#;

    #[test]
    fn parses_and_maps_to_arrow() {
        let c = Contract::parse(ORDERS, "orders.yaml", None).unwrap();
        let s = c.arrow_schema();
        assert_eq!(s.field(0).data_type(), &DataType::Int64);
        assert!(!s.field(0).is_nullable());
        assert_eq!(s.field(1).data_type(), &DataType::Utf8);
        assert!(s.field(1).is_nullable());
        assert_eq!(s.field(2).data_type(), &DataType::Decimal128(12, 2));
        assert_eq!(
            s.field(3).data_type(),
            &DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()))
        );
        assert!(matches!(s.field(4).data_type(), DataType::List(_)));
        assert_eq!(c.field("order_id").unwrap().constraints.minimum, Some(1.0));
        assert_eq!(
            c.field("customer").unwrap().constraints.max_length,
            Some(20)
        );
    }

    #[test]
    fn invalid_contract_has_code_and_path() {
        let bad = ORDERS.replace("logicalType: \"integer\"", "logicalType: \"int\"");
        let e = Contract::parse(&bad, "orders.yaml", None).unwrap_err();
        assert_eq!(e.code(), "ETL005");
        assert!(e.to_string().contains("orders.yaml"));
    }

    #[test]
    fn generated_contract_round_trips() {
        let c = Contract::parse(ORDERS, "orders.yaml", None).unwrap();
        let doc = contract_from_schema("orders copy", "orders", &c.arrow_schema()).unwrap();
        let yaml = serde_yaml::to_string(&doc).unwrap();
        let c2 = Contract::parse(&yaml, "gen.yaml", None).unwrap();
        assert_eq!(c2.arrow_schema(), c.arrow_schema());
    }
}

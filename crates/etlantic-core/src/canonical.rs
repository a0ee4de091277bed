//! Canonical JSON and fingerprints: the same value gives the same bytes on every machine.
//!
//! Canonical form: object keys sorted by their UTF-8 bytes, no insignificant whitespace,
//! numbers as serde_json prints them (shortest round-trip form). The fingerprint is the
//! lower-case hex SHA-256 of those bytes, prefixed with `sha256:`.

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// Returns `value` with every object's keys sorted.
pub fn canonicalize(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            let mut out = Map::new();
            for k in keys {
                out.insert(k.clone(), canonicalize(&map[k]));
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(canonicalize).collect()),
        other => other.clone(),
    }
}

/// The canonical compact JSON text of a value.
pub fn to_canonical_string(value: &Value) -> String {
    serde_json::to_string(&canonicalize(value)).expect("JSON values serialise")
}

/// `sha256:<hex>` of arbitrary bytes.
pub fn sha256_hex(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// `sha256:<hex>` of the canonical JSON of a value.
pub fn fingerprint(value: &Value) -> String {
    sha256_hex(to_canonical_string(value).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_does_not_matter() {
        let a = json!({"b": 1, "a": {"y": [1, {"d": 2, "c": 3}], "x": null}});
        let b = json!({"a": {"x": null, "y": [1, {"c": 3, "d": 2}]}, "b": 1});
        assert_eq!(to_canonical_string(&a), to_canonical_string(&b));
        assert_eq!(
            to_canonical_string(&a),
            r#"{"a":{"x":null,"y":[1,{"c":3,"d":2}]},"b":1}"#
        );
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert!(fingerprint(&a).starts_with("sha256:"));
    }
}

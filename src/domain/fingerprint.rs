//! Request fingerprints: SHA-256 of the canonical JSON of a request.
//!
//! Canonical means: object keys sorted by their UTF-8 bytes, no insignificant
//! whitespace, strings escaped the way serde_json escapes them, and numbers
//! that are whole and exactly representable written as integers (so `1.0` and
//! `1` are the same intent). The writer sorts keys itself, so the result does
//! not depend on whether serde_json was built with `preserve_order`.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Largest integer an f64 holds exactly (2^53).
const MAX_EXACT_F64_INT: f64 = 9_007_199_254_740_992.0;

/// The canonical JSON text of `value`.
pub fn canonical_json(value: &Value) -> String {
    let mut out = String::new();
    write_canonical(value, &mut out);
    out
}

/// Hex SHA-256 of the canonical JSON of `value`.
pub fn fingerprint(value: &Value) -> String {
    let digest = Sha256::digest(canonical_json(value).as_bytes());
    hex::encode(digest)
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Null | Value::Bool(_) | Value::String(_) => out.push_str(&value.to_string()),
        Value::Number(n) => match n.as_f64() {
            Some(f)
                if !n.is_i64()
                    && !n.is_u64()
                    && f.fract() == 0.0
                    && f.abs() <= MAX_EXACT_F64_INT =>
            {
                // Whole float: write it the way the integer would be written.
                out.push_str(&format!("{}", f as i64));
            }
            _ => out.push_str(&n.to_string()),
        },
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(item, out);
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(key.clone()).to_string());
                out.push(':');
                write_canonical(&map[key], out);
            }
            out.push('}');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a: Value = serde_json::from_str(r#"{"b": 1, "a": {"y": [1, 2], "x": "é"}}"#).unwrap();
        let b: Value = serde_json::from_str(r#"{"a":{"x":"\u00e9","y":[1,2]},"b":1}"#).unwrap();
        assert_eq!(fingerprint(&a), fingerprint(&b));
        assert_eq!(canonical_json(&a), r#"{"a":{"x":"é","y":[1,2]},"b":1}"#);
    }

    #[test]
    fn whole_floats_equal_integers_but_fractions_differ() {
        assert_eq!(
            fingerprint(&json!({"t": 1.0})),
            fingerprint(&json!({"t": 1}))
        );
        assert_ne!(
            fingerprint(&json!({"t": 1.5})),
            fingerprint(&json!({"t": 1}))
        );
    }

    #[test]
    fn array_order_matters() {
        assert_ne!(fingerprint(&json!([1, 2])), fingerprint(&json!([2, 1])));
    }
}

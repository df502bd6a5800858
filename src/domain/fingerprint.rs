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
    let mut out = Vec::new();
    write_canonical(value, &mut out);
    // serde_json writes UTF-8 only, and so does every other arm.
    String::from_utf8(out).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// Hex SHA-256 of the canonical JSON of `value`.
pub fn fingerprint(value: &Value) -> String {
    fingerprint_of_canonical(&canonical_json(value))
}

/// Hex SHA-256 of a text [`canonical_json`] wrote, for a caller that keeps
/// that text too (the job's stored request) and so writes it once.
pub fn fingerprint_of_canonical(canonical: &str) -> String {
    hex::encode(Sha256::digest(canonical.as_bytes()))
}

fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::String(s) => write_string(s, out),
        Value::Number(n) => match n.as_f64() {
            Some(f)
                if !n.is_i64()
                    && !n.is_u64()
                    && f.fract() == 0.0
                    && f.abs() <= MAX_EXACT_F64_INT =>
            {
                // Whole float: write it the way the integer would be written.
                out.extend_from_slice((f as i64).to_string().as_bytes());
            }
            _ => out.extend_from_slice(n.to_string().as_bytes()),
        },
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.push(b'{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_canonical(value, out);
            }
            out.push(b'}');
        }
    }
}

/// `s` quoted and escaped as serde_json escapes it, straight into `out`.
fn write_string(s: &str, out: &mut Vec<u8>) {
    // Writing to a Vec cannot fail, nor can serialising a str.
    let _ = serde_json::to_writer(&mut *out, s);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Strings and keys are escaped exactly as serde_json's own text of
    /// the value escapes them, which is what fingerprints stored by earlier
    /// builds were made from.
    #[test]
    fn strings_are_escaped_as_serde_json_escapes_them() {
        for text in [
            "plain",
            "quote \" and backslash \\",
            "controls \u{0} \u{1f} \n \t \r \u{8} \u{c}",
            "unicode é 数据 🦀 \u{2028} \u{7f}",
            "</script>",
        ] {
            let value = Value::String(text.to_string());
            assert_eq!(canonical_json(&value), value.to_string());
            let object = json!({ text: [text, null, true, false, 1, -2, 1.5] });
            assert_eq!(canonical_json(&object), object.to_string());
        }
    }

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

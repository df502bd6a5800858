//! Property tests of the request fingerprint: semantically equal JSON has one
//! fingerprint; changing any value changes it.
#![allow(clippy::unwrap_used)]

use onejob::domain::fingerprint::fingerprint;
use proptest::prelude::*;
use serde_json::{Map, Value};

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        (-1.0e9f64..1.0e9).prop_map(Value::from),
        "[a-zA-Z0-9 éم😀\"\\\\]{0,12}".prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z]{1,6}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Write `value` as JSON text with object keys in reverse order and with
/// extra whitespace: the same meaning, other bytes.
fn rewrite(value: &Value) -> String {
    match value {
        Value::Array(items) => format!(
            "[ {} ]",
            items.iter().map(rewrite).collect::<Vec<_>>().join(" ,\n ")
        ),
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.reverse();
            let parts: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{} :\t{}", Value::String(k.clone()), rewrite(v)))
                .collect();
            format!("{{\n  {}\n}}", parts.join(",\n  "))
        }
        // Whole floats may also be written as integers and vice versa.
        Value::Number(n) if n.is_i64() && n.as_i64().unwrap().abs() < (1 << 52) => {
            format!("{}.0", n.as_i64().unwrap())
        }
        other => other.to_string(),
    }
}

/// Every path to a leaf, as a list of steps.
fn leaf_paths(value: &Value, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                prefix.push(i.to_string());
                leaf_paths(item, prefix, out);
                prefix.pop();
            }
        }
        Value::Object(map) => {
            for (k, v) in map {
                prefix.push(k.clone());
                leaf_paths(v, prefix, out);
                prefix.pop();
            }
        }
        _ => out.push(prefix.clone()),
    }
}

fn leaf_at<'a>(value: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(value, |v, step| match v {
        Value::Array(items) => &mut items[step.parse::<usize>().unwrap()],
        Value::Object(map) => map.get_mut(step).unwrap(),
        _ => unreachable!(),
    })
}

/// A different value of a leaf.
fn changed(leaf: &Value) -> Value {
    match leaf {
        Value::Null => Value::Bool(false),
        Value::Bool(b) => Value::Bool(!b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => Value::from(i.wrapping_add(1)),
            None => Value::from(n.as_f64().unwrap() + 0.5),
        },
        Value::String(s) => Value::String(format!("{s}x")),
        _ => unreachable!(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn equal_json_has_one_fingerprint(value in json_value()) {
        let reparsed: Value = serde_json::from_str(&rewrite(&value)).unwrap();
        prop_assert_eq!(fingerprint(&value), fingerprint(&reparsed));
    }

    #[test]
    fn changing_any_value_changes_the_fingerprint(value in json_value(), pick in any::<prop::sample::Index>()) {
        let mut paths = Vec::new();
        leaf_paths(&value, &mut Vec::new(), &mut paths);
        prop_assume!(!paths.is_empty());
        let path = &paths[pick.index(paths.len())];
        let mut other = value.clone();
        let slot = leaf_at(&mut other, path);
        *slot = changed(slot);
        prop_assert_ne!(fingerprint(&value), fingerprint(&other));
    }

    #[test]
    fn renaming_a_key_changes_the_fingerprint(value in json_value()) {
        let wrapped = serde_json::json!({ "a": value.clone() });
        let renamed = serde_json::json!({ "b": value });
        prop_assert_ne!(fingerprint(&wrapped), fingerprint(&renamed));
    }
}

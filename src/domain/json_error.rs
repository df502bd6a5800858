//! A JSON body's shape errors in JSON's words, the one wording every
//! endpoint and door uses: `field.path: why`. serde speaks of a `map`, a
//! `sequence` and `struct Limits`; a client sent an object and an array,
//! and has never seen our type names.

/// `path: why` for a value that did not fit its type, or `why` alone when
/// the fault is the whole value.
pub fn path_error(e: serde_path_to_error::Error<serde_json::Error>) -> String {
    let path = e.path().to_string();
    let why = json_words(&e.into_inner().to_string());
    if path == "." {
        why
    } else {
        format!("{path}: {why}")
    }
}

/// serde's message with its Rust words put in JSON's.
pub fn json_words(message: &str) -> String {
    let mut out = message
        .replace("invalid type: map", "invalid type: object")
        .replace("invalid type: sequence", "invalid type: array")
        .replace("invalid type: unit value", "invalid type: null")
        .replace("expected a map", "expected an object")
        .replace("expected a sequence", "expected an array")
        .replace("expected unit", "expected null")
        .replace("expected string or map", "expected a string or an object");
    // `expected struct Limits`, `expected tuple struct Pair`
    for (rust, json) in [
        ("expected struct ", "expected an object"),
        ("expected tuple struct ", "expected an array"),
    ] {
        while let Some(at) = out.find(rust) {
            let name_end = out[at + rust.len()..]
                .find(|c: char| !(c.is_alphanumeric() || c == '_'))
                .map_or(out.len(), |n| at + rust.len() + n);
            out.replace_range(at..name_end, json);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[allow(dead_code)]
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Limits {
        rps: u32,
    }

    #[allow(dead_code)]
    #[derive(Debug, Deserialize)]
    struct Body {
        limits: Option<Limits>,
        tags: Option<Vec<String>>,
        reason: Option<String>,
        role: Option<Role>,
    }

    #[allow(dead_code)]
    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "lowercase")]
    enum Role {
        User,
        Assistant,
    }

    fn refused(json: &str) -> String {
        // As the endpoints do: the body is a JSON tree first.
        let value: serde_json::Value = serde_json::from_str(json).unwrap();
        path_error(serde_path_to_error::deserialize::<_, Body>(value).unwrap_err())
    }

    #[test]
    fn shape_errors_name_json_types_not_rust_ones() {
        assert_eq!(
            refused(r#"{"limits": 5}"#),
            "limits: invalid type: integer `5`, expected an object"
        );
        assert_eq!(
            refused(r#"{"tags": {"a": 1}}"#),
            "tags: invalid type: object, expected an array"
        );
        assert_eq!(
            refused(r#"{"reason": ["x"]}"#),
            "reason: invalid type: array, expected a string"
        );
        assert_eq!(
            refused(r#"{"limits": {"rps": 1, "burst": 2}}"#),
            "limits.burst: unknown field `burst`, expected `rps`"
        );
        assert_eq!(
            refused("5"),
            "invalid type: integer `5`, expected an object"
        );
        assert_eq!(
            refused(r#"{"role": 5}"#),
            "role: invalid type: integer `5`, expected a string or an object"
        );
    }
}

//! A value for a JSON Schema, drawn from a seeded generator so the same
//! prompt always gets the same answer.
//!
//! Supported: `type` (a name or a list, so `["string","null"]` is nullable),
//! `enum`, `const`, objects (`properties`, `required`; optional properties
//! are included half the time; no additional properties are ever invented),
//! strings (`minLength`, `maxLength`), integers and numbers (`minimum`,
//! `maximum`, `exclusiveMinimum`, `exclusiveMaximum`), booleans, arrays
//! (`items`, `minItems`, `maxItems`), `anyOf`/`oneOf` (the first branch).
//! Not supported: `pattern`, `format`, `$ref`, `allOf`.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde_json::{json, Map, Value};

const WORDS: &[&str] = &[
    "amber", "basil", "cedar", "delta", "ember", "fjord", "garnet", "harbor", "indigo", "juniper",
    "kestrel", "lumen", "meadow", "nectar", "orbit", "pebble", "quartz", "raven", "sierra",
    "tundra", "umber", "violet", "willow", "xenon", "yarrow", "zephyr",
];

/// Depth beyond which nested arrays/objects are generated minimally.
const MAX_DEPTH: usize = 8;

pub fn generate(schema: &Value, rng: &mut StdRng) -> Value {
    value_for(schema, rng, 0)
}

/// `n` words of deterministic prose.
pub fn prose(rng: &mut StdRng, n: usize) -> String {
    let words: Vec<&str> = (0..n).filter_map(|_| WORDS.choose(rng).copied()).collect();
    let mut text = words.join(" ");
    if let Some(first) = text.get_mut(0..1) {
        first.make_ascii_uppercase();
    }
    text.push('.');
    text
}

fn value_for(schema: &Value, rng: &mut StdRng, depth: usize) -> Value {
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
        if let Some(choice) = choices.choose(rng) {
            return choice.clone();
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(first) = schema.get(key).and_then(|v| v.get(0)) {
            return value_for(first, rng, depth + 1);
        }
    }
    let ty = match schema.get("type") {
        Some(Value::String(t)) => t.as_str(),
        Some(Value::Array(types)) => {
            // Nullable: null a quarter of the time, else the first other type.
            let nullable = types.iter().any(|t| t == "null");
            match types
                .iter()
                .filter_map(Value::as_str)
                .find(|t| *t != "null")
            {
                Some(t) if !(nullable && rng.gen_bool(0.25)) => t,
                _ => "null",
            }
        }
        _ if schema.get("properties").is_some() => "object",
        _ if schema.get("items").is_some() => "array",
        _ => "string",
    };
    match ty {
        "object" => object_for(schema, rng, depth),
        "array" => array_for(schema, rng, depth),
        "string" => Value::String(string_for(schema, rng)),
        "integer" => integer_for(schema, rng),
        "number" => number_for(schema, rng),
        "boolean" => Value::Bool(rng.gen_bool(0.5)),
        _ => Value::Null,
    }
}

fn object_for(schema: &Value, rng: &mut StdRng, depth: usize) -> Value {
    let mut out = Map::new();
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in properties {
            let wanted =
                required.contains(&name.as_str()) || (depth < MAX_DEPTH && rng.gen_bool(0.5));
            if wanted {
                out.insert(name.clone(), value_for(sub, rng, depth + 1));
            }
        }
    }
    Value::Object(out)
}

fn array_for(schema: &Value, rng: &mut StdRng, depth: usize) -> Value {
    let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = schema
        .get("maxItems")
        .and_then(Value::as_u64)
        .map_or(min.max(3), |m| m as usize)
        .max(min);
    let len = if depth >= MAX_DEPTH {
        min
    } else {
        rng.gen_range(min..=max)
    };
    let items = schema.get("items").cloned().unwrap_or(json!({}));
    Value::Array(
        (0..len)
            .map(|_| value_for(&items, rng, depth + 1))
            .collect(),
    )
}

fn string_for(schema: &Value, rng: &mut StdRng) -> String {
    let min = schema.get("minLength").and_then(Value::as_u64).unwrap_or(0) as usize;
    let max = schema
        .get("maxLength")
        .and_then(Value::as_u64)
        .map_or(min.max(24), |m| m as usize)
        .max(min);
    let target = rng.gen_range(min.max(1).min(max)..=max);
    let mut text = String::new();
    while text.len() < target {
        if !text.is_empty() {
            text.push(' ');
        }
        text.push_str(WORDS.choose(rng).copied().unwrap_or("x"));
    }
    // ASCII only, so byte length is character length.
    text.truncate(target);
    while text.len() < min {
        text.push('x');
    }
    text
}

fn bounds(schema: &Value, default_lo: f64, default_hi: f64) -> (f64, f64, bool, bool) {
    let get = |k: &str| schema.get(k).and_then(Value::as_f64);
    let (lo, lo_excl) = match (get("minimum"), get("exclusiveMinimum")) {
        (_, Some(x)) => (x, true),
        (Some(m), None) => (m, false),
        (None, None) => (default_lo, false),
    };
    let (hi, hi_excl) = match (get("maximum"), get("exclusiveMaximum")) {
        (_, Some(x)) => (x, true),
        (Some(m), None) => (m, false),
        (None, None) => (lo.max(default_lo) + (default_hi - default_lo), false),
    };
    (lo, hi, lo_excl, hi_excl)
}

fn integer_for(schema: &Value, rng: &mut StdRng) -> Value {
    let (lo, hi, lo_excl, hi_excl) = bounds(schema, 0.0, 100.0);
    let lo = if lo_excl {
        lo.floor() as i64 + 1
    } else {
        lo.ceil() as i64
    };
    let hi = if hi_excl {
        hi.ceil() as i64 - 1
    } else {
        hi.floor() as i64
    };
    json!(if lo <= hi { rng.gen_range(lo..=hi) } else { lo })
}

fn number_for(schema: &Value, rng: &mut StdRng) -> Value {
    let (lo, hi, lo_excl, hi_excl) = bounds(schema, 0.0, 100.0);
    if lo >= hi {
        return json!(lo);
    }
    // Two decimals, kept strictly inside exclusive bounds.
    let step = 0.01_f64.min((hi - lo) / 4.0);
    let lo = if lo_excl { lo + step } else { lo };
    let hi = if hi_excl { hi - step } else { hi };
    let x = rng.gen_range(lo..=hi.max(lo));
    let rounded = (x * 100.0).round() / 100.0;
    json!(if rounded >= lo && rounded <= hi {
        rounded
    } else {
        x
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn same_seed_same_value() {
        let schema = json!({"type":"object","properties":{"a":{"type":"integer","minimum":3,"maximum":5},
            "b":{"type":["string","null"],"maxLength":4}},"required":["a","b"],"additionalProperties":false});
        let a = generate(&schema, &mut StdRng::seed_from_u64(7));
        let b = generate(&schema, &mut StdRng::seed_from_u64(7));
        assert_eq!(a, b);
        let n = a["a"].as_i64().unwrap();
        assert!((3..=5).contains(&n));
        assert!(a["b"].is_null() || a["b"].as_str().unwrap().len() <= 4);
    }
}

//! Checking a provider's answer against the contract.
//!
//! [`Contract::validate_output`] is what the engine calls on every successful
//! answer of a contract job; a [`Violation`] becomes a failed attempt of kind
//! `contract_violation` (`ErrorKind::ContractViolation`). [`Contract::check_round_trip`] is the contract run's
//! extra check that a case's expected fields came back.

use super::definition::{Case, Contract};
use crate::domain::fingerprint::canonical_json;
use serde::Serialize;
use serde_json::Value;

/// One thing wrong with an answer, located by JSON pointer ("" is the root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub pointer: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Violation {
    /// The answer is not JSON at all (prose, a code fence, truncated JSON).
    #[error("output is not JSON: {detail} (output starts {excerpt:?})")]
    NotJson { detail: String, excerpt: String },
    /// JSON that breaks the schema, or carries keys the schema does not know.
    #[error("output breaks the schema: {}", describe(problems))]
    Schema { problems: Vec<Problem> },
}

fn describe(problems: &[Problem]) -> String {
    problems
        .iter()
        .map(|p| {
            let at = if p.pointer.is_empty() {
                "/"
            } else {
                &p.pointer
            };
            format!("at {at}: {}", p.message)
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A case's expected fields did not come back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize)]
#[error("{}", describe(problems))]
pub struct RoundTripMismatch {
    pub problems: Vec<Problem>,
}

/// How many characters of an unparsable answer a message quotes.
const EXCERPT_CHARS: usize = 60;

impl Contract {
    /// Parse `output_text` as JSON and validate it against the contract's
    /// schema. Top-level keys the schema's `properties` do not declare are
    /// reported as invented even if the schema forgot
    /// `additionalProperties: false`.
    pub fn validate_output(&self, output_text: &str) -> Result<Value, Violation> {
        let value: Value = serde_json::from_str(output_text).map_err(|e| Violation::NotJson {
            detail: e.to_string(),
            excerpt: output_text
                .trim_start()
                .chars()
                .take(EXCERPT_CHARS)
                .collect(),
        })?;

        let mut problems = invented_top_level_keys(&self.schema, &value);
        // additionalProperties:false would report the same keys again, less clearly.
        let invented: Vec<String> = problems.iter().map(|p| p.pointer.clone()).collect();
        for error in self.validator.iter_errors(&value) {
            let pointer = error.instance_path().to_string();
            let is_additional = error
                .schema_path()
                .to_string()
                .ends_with("/additionalProperties");
            if is_additional && pointer.is_empty() && !invented.is_empty() {
                continue;
            }
            problems.push(Problem {
                pointer,
                message: error.to_string(),
            });
        }
        if problems.is_empty() {
            Ok(value)
        } else {
            Err(Violation::Schema { problems })
        }
    }

    /// The round-trip rule of [`super::Expectation`]: every expected field is
    /// present and non-null; with `[round_trip] exact = true`, each
    /// `expect.values` entry is equal too.
    pub fn check_round_trip(&self, case: &Case, output: &Value) -> Result<(), RoundTripMismatch> {
        let mut problems = Vec::new();
        for field in &case.expect.fields {
            let pointer = format!("/{}", escape_pointer_token(field));
            match output.get(field) {
                None => problems.push(Problem {
                    pointer,
                    message: format!("expected field `{field}` is missing"),
                }),
                Some(Value::Null) => problems.push(Problem {
                    pointer,
                    message: format!("expected field `{field}` came back null"),
                }),
                Some(got) if self.exact_values => {
                    if let Some(want) = case.expect.values.get(field) {
                        // Equal as JSON Schema counts equal: `4.0` is `4`.
                        if canonical_json(got) != canonical_json(want) {
                            problems.push(Problem {
                                pointer,
                                message: format!("expected {want}, got {got}"),
                            });
                        }
                    }
                }
                Some(_) => {}
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(RoundTripMismatch { problems })
        }
    }
}

fn invented_top_level_keys(schema: &Value, output: &Value) -> Vec<Problem> {
    let (Some(declared), Some(object)) = (
        schema.get("properties").and_then(Value::as_object),
        output.as_object(),
    ) else {
        return Vec::new();
    };
    object
        .keys()
        .filter(|key| !declared.contains_key(*key))
        .map(|key| Problem {
            pointer: format!("/{}", escape_pointer_token(key)),
            message: format!(
                "invented top-level key `{key}` (not declared in schema.json properties)"
            ),
        })
        .collect()
}

/// RFC 6901: `~` → `~0`, `/` → `~1`.
fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contracts::definition::load_all;
    use serde_json::json;
    use std::path::Path;

    fn contract(name: &str) -> Contract {
        load_all(&Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts"))
            .unwrap()
            .remove(name)
            .unwrap()
    }

    fn valid_triage() -> Value {
        json!({
            "category": "billing",
            "priority": "high",
            "summary": "Customer was charged twice for the March invoice.",
            "language": "en",
            "needs_human": true,
            "product": null
        })
    }

    #[test]
    fn schema_valid_answer_passes() {
        let contract = contract("ticket-triage");
        let value = contract
            .validate_output(&valid_triage().to_string())
            .unwrap();
        assert_eq!(value["category"], "billing");
    }

    #[test]
    fn hallucinated_top_level_key_is_named() {
        let contract = contract("ticket-triage");
        let mut answer = valid_triage();
        answer["sentiment"] = json!("angry");
        let err = contract.validate_output(&answer.to_string()).unwrap_err();
        let Violation::Schema { problems } = &err else {
            panic!("{err}")
        };
        assert_eq!(problems.len(), 1, "{err}");
        assert_eq!(problems[0].pointer, "/sentiment");
        assert!(
            err.to_string()
                .contains("invented top-level key `sentiment`"),
            "{err}"
        );
    }

    #[test]
    fn invented_key_is_flagged_even_without_additional_properties_false() {
        let mut contract = contract("ticket-triage");
        contract
            .schema
            .as_object_mut()
            .unwrap()
            .remove("additionalProperties");
        let mut answer = valid_triage();
        answer["confidence"] = json!(0.9);
        let err = contract.validate_output(&answer.to_string()).unwrap_err();
        assert!(err.to_string().contains("`confidence`"), "{err}");
    }

    #[test]
    fn prose_answer_is_not_json() {
        let contract = contract("ticket-triage");
        let err = contract
            .validate_output("Sure! Here is the triage: the category is billing.")
            .unwrap_err();
        assert!(matches!(err, Violation::NotJson { .. }), "{err}");
        assert!(err.to_string().contains("Sure! Here is"), "{err}");
    }

    #[test]
    fn wrong_enum_value_names_its_pointer() {
        let contract = contract("ticket-triage");
        let mut answer = valid_triage();
        answer["priority"] = json!("whenever");
        let err = contract.validate_output(&answer.to_string()).unwrap_err();
        let Violation::Schema { problems } = &err else {
            panic!("{err}")
        };
        assert_eq!(problems[0].pointer, "/priority", "{err}");
    }

    #[test]
    fn nested_schema_error_is_located() {
        let contract = contract("invoice-extraction");
        let answer = json!({
            "vendor_name": "ACME GmbH",
            "invoice_number": "INV-1",
            "invoice_date": "2024-03-01",
            "currency": "EUR",
            "total_amount": 10.0,
            "line_items": [{"description": "x", "quantity": "two", "unit_price": 5.0, "amount": 10.0}]
        });
        let err = contract.validate_output(&answer.to_string()).unwrap_err();
        assert!(err.to_string().contains("/line_items/0/quantity"), "{err}");
    }

    #[test]
    fn round_trip_passes_on_any_non_null_expected_fields_when_not_exact() {
        let contract = contract("ticket-triage");
        assert!(!contract.exact_values);
        for case in &contract.cases {
            contract.check_round_trip(case, &valid_triage()).unwrap();
        }
    }

    #[test]
    fn round_trip_names_missing_and_null_fields() {
        let contract = contract("ticket-triage");
        let case = &contract.cases[0];
        let mut answer = valid_triage();
        let first = case.expect.fields[0].clone();
        answer.as_object_mut().unwrap().remove(&first);
        let err = contract.check_round_trip(case, &answer).unwrap_err();
        assert!(
            err.to_string().contains(&format!("`{first}` is missing")),
            "{err}"
        );
    }

    #[test]
    fn exact_contract_compares_values() {
        let mut contract = contract("ticket-triage");
        contract.exact_values = true;
        let case = contract
            .cases
            .iter()
            .find(|c| !c.expect.values.is_empty())
            .unwrap()
            .clone();
        let (field, want) = case.expect.values.iter().next().unwrap();
        let mut answer = valid_triage();
        answer[field] = want.clone();
        for other in &case.expect.fields {
            if let Some(v) = case.expect.values.get(other) {
                answer[other] = v.clone();
            }
        }
        contract.check_round_trip(&case, &answer).unwrap();
        // A whole number written with a fraction is the same number.
        let mut numbered = contract.clone();
        let mut case_4 = case.clone();
        case_4.expect.values.insert(field.clone(), json!(4));
        numbered.cases = vec![case_4.clone()];
        let mut four = answer.clone();
        four[field] = json!(4.0);
        numbered.check_round_trip(&case_4, &four).unwrap();
        four[field] = json!(4.5);
        assert!(numbered.check_round_trip(&case_4, &four).is_err());
        answer[field] = json!("something else");
        let err = contract.check_round_trip(&case, &answer).unwrap_err();
        assert!(err.to_string().contains(&format!("/{field}")), "{err}");
    }
}

//! The contracts library through its public API only, as the CLI, the admin
//! endpoint and the engine will use it.

#![allow(clippy::unwrap_used)]

use onejob::contracts::{
    count_prompt_tokens, load_all, CheckKind, Contract, Violation, WireFormat,
};
use onejob::domain::request::Role;
use std::path::Path;

fn shipped() -> std::collections::BTreeMap<String, Contract> {
    load_all(&Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts")).unwrap()
}

#[test]
fn engine_can_build_requests_and_judge_answers_for_every_shipped_case() {
    for contract in shipped().values() {
        for case in &contract.cases {
            for wire in [WireFormat::OpenAi, WireFormat::Anthropic] {
                let request = contract
                    .chat_request(&case.input, wire, format!("job-{}", case.name))
                    .unwrap();
                assert_eq!(request.messages.last().unwrap().role, Role::User);
                assert_eq!(request.system.is_some(), wire == WireFormat::Anthropic);
                assert!(request.response_schema.is_some());
            }
        }
        let err = contract
            .validate_output("I could not find an invoice.")
            .unwrap_err();
        assert!(matches!(err, Violation::NotJson { .. }));
    }
}

#[test]
fn special_token_strings_in_user_text_are_counted_as_plain_text() {
    let contracts = shipped();
    let contract = &contracts["ticket-triage"];
    let case = contract.case("special-tokens-injection").unwrap();
    let prompt = contract.render(&case.input, WireFormat::OpenAi).unwrap();
    assert!(prompt
        .messages
        .last()
        .unwrap()
        .content
        .contains("<|endoftext|>"));
    for tokenizer in ["o200k_base", "cl100k_base"] {
        let counted = count_prompt_tokens(tokenizer, &prompt).unwrap();
        assert!(counted > 100, "{tokenizer}: {counted}");
    }
}

#[test]
fn check_kinds_serialize_as_the_names_ops_see() {
    let names: Vec<String> = CheckKind::ALL
        .iter()
        .map(|k| {
            serde_json::to_value(k)
                .unwrap()
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        names,
        ["prompt_rendering", "tokenizer", "schema", "round_trip"]
    );
}

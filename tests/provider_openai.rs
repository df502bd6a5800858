//! The OpenAI adapter against a fake upstream speaking OpenAI's published
//! Chat Completions format.
#![allow(clippy::unwrap_used)]

mod upstream;

use onejob::domain::FinishReason;
use onejob::providers::{build_provider, AttemptOutcome, Lookup};
use serde_json::json;
use std::time::Duration;
use upstream::{json, json_with, request, run_rows, transport_rows, upstream, Expect, Row};

const SUCCESS: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"m",
 "choices":[{"index":0,"message":{"role":"assistant","content":"{\"a\":\"x\"}","refusal":null},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;

fn error(message: &str, kind: &str, code: &str) -> String {
    format!(r#"{{"error":{{"message":"{message}","type":"{kind}","param":null,"code":"{code}"}}}}"#)
}

#[tokio::test]
async fn every_answer_class_is_classified_where_it_is_born() {
    let mut rows = vec![
        Row {
            name: "200 completion",
            reply: json(200, SUCCESS),
            expect: Expect::Succeeded {
                output: "{\"a\":\"x\"}",
            },
        },
        Row {
            name: "400 context_length_exceeded",
            reply: json(
                400,
                &error(
                    "This model's maximum context length is 8192 tokens",
                    "invalid_request_error",
                    "context_length_exceeded",
                ),
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "context_length_exceeded",
                retry_after: None,
            },
        },
        Row {
            name: "400 content policy",
            reply: json(
                400,
                &error(
                    "rejected by our safety system",
                    "invalid_request_error",
                    "content_policy_violation",
                ),
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "content_policy",
                retry_after: None,
            },
        },
        Row {
            name: "429 with Retry-After seconds",
            reply: json_with(
                429,
                vec![("retry-after", "7")],
                &error("Rate limit reached", "requests", "rate_limit_exceeded"),
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "rate_limited",
                retry_after: Some(Duration::from_secs(7)),
            },
        },
        Row {
            name: "429 with retry-after-ms",
            reply: json_with(
                429,
                vec![("retry-after-ms", "1500"), ("retry-after", "2")],
                &error("slow down", "requests", "rate_limit_exceeded"),
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "rate_limited",
                retry_after: Some(Duration::from_millis(1500)),
            },
        },
        Row {
            name: "401",
            reply: json(
                401,
                &error(
                    "Incorrect API key provided",
                    "invalid_request_error",
                    "invalid_api_key",
                ),
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "unauthorized",
                retry_after: None,
            },
        },
        Row {
            name: "404 model",
            reply: json(
                404,
                &error(
                    "The model does not exist",
                    "invalid_request_error",
                    "model_not_found",
                ),
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "not_found",
                retry_after: None,
            },
        },
        Row {
            name: "200 refusal",
            reply: json(
                200,
                r#"{"id":"c","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":"I can't help"},"finish_reason":"stop"}]}"#,
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "content_policy",
                retry_after: None,
            },
        },
        Row {
            name: "200 without choices",
            reply: json(200, r#"{"id":"c"}"#),
            expect: Expect::Unknown {
                kind: "invalid_body",
            },
        },
    ];
    rows.extend(transport_rows());
    run_rows("openai", rows).await;
}

#[tokio::test]
async fn request_carries_key_auth_system_first_and_response_format() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("openai", &up.base_url);
    let outcome = provider.call(&request()).await;
    let AttemptOutcome::Succeeded(success) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(success.provider_request_id.as_deref(), Some("chatcmpl-1"));
    assert_eq!(
        success
            .usage
            .map(|u| (u.prompt_tokens, u.completion_tokens)),
        Some((12, 3))
    );

    let seen = up.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.uri.path(), "/v1/chat/completions");
    assert_eq!(s.headers["idempotency-key"], "onejob-test-key");
    assert_eq!(
        s.headers["authorization"],
        format!("Bearer {}", upstream::KEY_VALUE)
    );
    assert_eq!(
        s.body["messages"][0],
        serde_json::json!({"role":"system","content":"Answer in JSON."})
    );
    assert_eq!(s.body["messages"].as_array().unwrap().len(), 5);
    assert_eq!(s.body["response_format"]["type"], "json_schema");
    assert_eq!(s.body["response_format"]["json_schema"]["strict"], true);
    assert_eq!(
        s.body["response_format"]["json_schema"]["schema"],
        request().response_schema.unwrap()
    );
    // OpenAI's current field: its reasoning models refuse `max_tokens`.
    assert_eq!(s.body["max_completion_tokens"], 64);
    assert!(s.body.get("max_tokens").is_none(), "{}", s.body);
    assert!(s.body.get("store").is_none(), "store only when configured");
}

#[tokio::test]
async fn stored_completions_are_found_by_key() {
    let list = format!(
        r#"{{"object":"list","data":[{SUCCESS}],"first_id":"chatcmpl-1","last_id":"chatcmpl-1","has_more":false}}"#
    );
    let up = upstream(json(200, &list)).await;
    let config = upstream::config(
        "openai",
        &up.base_url,
        "store = true\nlookup = \"openai_stored\"",
    );
    let provider = build_provider("openai", &config).unwrap();

    provider.call(&request()).await;
    let create = &up.seen()[0];
    assert_eq!(create.body["store"], true);
    assert_eq!(create.body["metadata"]["onejob_key"], "onejob-test-key");

    let Lookup::Found(found) = provider.lookup("onejob-test-key").await else {
        panic!("not found")
    };
    assert_eq!(found.output, "{\"a\":\"x\"}");
    let query = up.seen()[1].uri.query().unwrap().to_string();
    assert!(
        query.contains("onejob_key") && query.contains("onejob-test-key"),
        "{query}"
    );

    let empty = upstream(json(200, r#"{"object":"list","data":[],"has_more":false}"#)).await;
    let config = upstream::config(
        "openai",
        &empty.base_url,
        "store = true\nlookup = \"openai_stored\"",
    );
    let provider = build_provider("openai", &config).unwrap();
    assert_eq!(provider.lookup("k").await, Lookup::NotFound);

    let broken = upstream(json(500, "")).await;
    let config = upstream::config(
        "openai",
        &broken.base_url,
        "store = true\nlookup = \"openai_stored\"",
    );
    let provider = build_provider("openai", &config).unwrap();
    assert!(matches!(provider.lookup("k").await, Lookup::CannotTell(_)));
}

/// Sampling options, tools and a tool turn go out as OpenAI's fields; a
/// tool-calling answer with no content comes back as tool calls.
#[tokio::test]
async fn options_tools_and_tool_calls_are_carried() {
    use onejob::domain::request::{Message, Role};
    const TOOL_CALL: &str = r#"{"id":"chatcmpl-2","object":"chat.completion","created":1,"model":"m",
     "choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,
       "tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},
       "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}"#;
    let up = upstream(json(200, TOOL_CALL)).await;
    let provider = upstream::provider("openai", &up.base_url);
    let mut req = request();
    let parts = vec![
        json!({"type": "text", "text": "what is this?"}),
        json!({"type": "image_url", "image_url": {"url": "https://example.test/cat.png"}}),
    ];
    let mut picture = Message::new(Role::User, "what is this?");
    picture.parts = Some(parts.clone());
    let mut result = Message::new(Role::Tool, "42");
    result.tool_call_id = Some("call_0".into());
    req.messages.extend([picture, result]);
    req.options = onejob::providers::ChatOptions {
        stop: Some(vec!["END".into()]),
        seed: Some(7),
        user: Some("u-1".into()),
        presence_penalty: Some(0.5),
        frequency_penalty: Some(-0.5),
        tools: Some(vec![json!({"type": "function", "function": {"name": "f"}})]),
        tool_choice: Some(json!("auto")),
        json_object: false,
        schema_name: Some("triage".into()),
        parallel_tool_calls: Some(false),
        openai: None,
    };
    let AttemptOutcome::Succeeded(success) = provider.call(&req).await else {
        panic!("not a success")
    };
    assert_eq!(success.output, "");
    assert_eq!(success.tool_calls[0]["id"], "call_1");
    let sent = &up.seen()[0].body;
    for (field, value) in [
        ("stop", json!(["END"])),
        ("seed", json!(7)),
        ("user", json!("u-1")),
        ("presence_penalty", json!(0.5)),
        ("frequency_penalty", json!(-0.5)),
        ("tool_choice", json!("auto")),
        ("parallel_tool_calls", json!(false)),
    ] {
        assert_eq!(sent[field], value, "{field}");
    }
    assert_eq!(sent["tools"][0]["function"]["name"], "f");
    assert_eq!(sent["response_format"]["json_schema"]["name"], "triage");
    let messages = sent["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(
        messages[n - 2],
        json!({"role": "user", "content": parts}),
        "image parts as given"
    );
    assert_eq!(
        messages[n - 1],
        json!({"role": "tool", "content": "42", "tool_call_id": "call_0"})
    );
}

#[tokio::test]
async fn a_length_stop_is_kept_with_the_answer() {
    let cut = SUCCESS.replace(r#""finish_reason":"stop""#, r#""finish_reason":"length""#);
    let up = upstream(json(200, &cut)).await;
    let provider = upstream::provider("openai", &up.base_url);
    let AttemptOutcome::Succeeded(success) = provider.call(&request()).await else {
        panic!("an answer")
    };
    assert_eq!(success.finish, Some(FinishReason::Length));
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("openai", &up.base_url);
    let AttemptOutcome::Succeeded(success) = provider.call(&request()).await else {
        panic!("an answer")
    };
    assert_eq!(success.finish, Some(FinishReason::Stop));
}

#[tokio::test]
async fn a_token_limit_is_sent_only_when_asked_in_the_field_the_file_names() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("openai", &up.base_url);
    let unlimited = onejob::providers::ChatRequest {
        max_tokens: None,
        ..request()
    };
    provider.call(&unlimited).await;
    let compat = build_provider(
        "compat",
        &upstream::config("openai", &up.base_url, "max_tokens_field = \"max_tokens\""),
    )
    .unwrap();
    compat.call(&request()).await;
    compat.call(&unlimited).await;
    let seen = up.seen();
    let limits: Vec<(Option<&serde_json::Value>, Option<&serde_json::Value>)> = seen
        .iter()
        .map(|s| {
            (
                s.body.get("max_tokens"),
                s.body.get("max_completion_tokens"),
            )
        })
        .collect();
    assert_eq!(
        limits,
        vec![(None, None), (Some(&json!(64)), None), (None, None)],
        "no limit unless asked; max_tokens where the file says so"
    );
}

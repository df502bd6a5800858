//! The Anthropic adapter against a fake upstream speaking Anthropic's
//! published Messages format.
#![allow(clippy::unwrap_used)]

mod upstream;

use onejob::domain::FinishReason;
use onejob::providers::{AttemptOutcome, Lookup};
use serde_json::json;
use std::time::Duration;
use upstream::{json, json_with, request, run_rows, transport_rows, upstream, Expect, Row};

const SUCCESS: &str = r#"{"id":"msg_1","type":"message","role":"assistant","model":"m",
 "content":[{"type":"text","text":"{\"a\":"},{"type":"text","text":"\"x\"}"}],
 "stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":20,"output_tokens":4}}"#;

fn error(kind: &str, message: &str) -> String {
    format!(r#"{{"type":"error","error":{{"type":"{kind}","message":"{message}"}}}}"#)
}

#[tokio::test]
async fn every_answer_class_is_classified_where_it_is_born() {
    let mut rows = vec![
        Row {
            name: "200 message",
            reply: json(200, SUCCESS),
            expect: Expect::Succeeded {
                output: "{\"a\":\"x\"}",
            },
        },
        Row {
            name: "400 prompt too long",
            reply: json(
                400,
                &error(
                    "invalid_request_error",
                    "prompt is too long: 210000 tokens > 200000 maximum",
                ),
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "context_length_exceeded",
                retry_after: None,
            },
        },
        Row {
            name: "400 usage policy",
            reply: json(
                400,
                &error(
                    "invalid_request_error",
                    "Output blocked by content filtering policy (content_filter)",
                ),
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "content_policy",
                retry_after: None,
            },
        },
        Row {
            name: "429 with Retry-After",
            reply: json_with(
                429,
                vec![("retry-after", "12")],
                &error(
                    "rate_limit_error",
                    "Number of request tokens has exceeded your per-minute rate limit",
                ),
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "rate_limited",
                retry_after: Some(Duration::from_secs(12)),
            },
        },
        Row {
            name: "529 overloaded",
            reply: json(529, &error("overloaded_error", "Overloaded")),
            expect: Expect::Failed {
                retryable: true,
                kind: "overloaded",
                retry_after: None,
            },
        },
        Row {
            name: "401",
            reply: json(401, &error("authentication_error", "invalid x-api-key")),
            expect: Expect::Failed {
                retryable: false,
                kind: "unauthorized",
                retry_after: None,
            },
        },
        Row {
            name: "200 refusal",
            reply: json(
                200,
                r#"{"id":"m","type":"message","content":[],"stop_reason":"refusal","usage":{"input_tokens":1,"output_tokens":0}}"#,
            ),
            expect: Expect::Failed {
                retryable: false,
                kind: "content_policy",
                retry_after: None,
            },
        },
        Row {
            name: "200 without content",
            reply: json(200, r#"{"id":"m","type":"message"}"#),
            expect: Expect::Unknown {
                kind: "invalid_body",
            },
        },
    ];
    rows.extend(transport_rows());
    run_rows("anthropic", rows).await;
}

#[tokio::test]
async fn request_has_top_level_system_alternating_turns_and_headers() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("anthropic", &up.base_url);
    let outcome = provider.call(&request()).await;
    let AttemptOutcome::Succeeded(success) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(success.provider_request_id.as_deref(), Some("msg_1"));
    assert_eq!(
        success
            .usage
            .map(|u| (u.prompt_tokens, u.completion_tokens)),
        Some((20, 4))
    );

    let s = &up.seen()[0];
    assert_eq!(s.uri.path(), "/v1/messages");
    assert_eq!(s.headers["x-api-key"], upstream::KEY_VALUE);
    assert_eq!(s.headers["anthropic-version"], "2023-06-01");
    assert_eq!(s.headers["idempotency-key"], "onejob-test-key");
    assert_eq!(s.body["system"], "Answer in JSON.");
    assert_eq!(
        s.body["messages"],
        json!([{"role":"user","content":"first\n\nsecond"},{"role":"assistant","content":"ok"},
               {"role":"user","content":"third"}])
    );
    assert_eq!(s.body["max_tokens"], 64);
}

#[tokio::test]
async fn a_conversation_opening_with_the_assistant_is_never_sent() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("anthropic", &up.base_url);
    let mut req = request();
    req.messages.insert(
        0,
        onejob::domain::request::Message::new(onejob::domain::request::Role::Assistant, "hello"),
    );
    let outcome = provider.call(&req).await;
    assert!(
        matches!(&outcome, AttemptOutcome::Failed(f) if !f.retryable && f.kind == "invalid_prompt"),
        "{outcome:?}"
    );
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn anthropic_cannot_tell_by_key() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("anthropic", &up.base_url);
    assert!(matches!(provider.lookup("k").await, Lookup::CannotTell(m) if m.contains("no lookup")));
    assert!(up.seen().is_empty());
}

/// Tool definitions, a tool call and its result, stop and user, in
/// Anthropic's terms; a `tool_use` answer comes back as an OpenAI tool call.
#[tokio::test]
async fn tools_and_tool_turns_are_carried_in_anthropics_terms() {
    use onejob::domain::request::{Message, Role};
    const TOOL_USE: &str = r#"{"id":"msg_2","type":"message","role":"assistant","model":"m",
     "content":[{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Oslo"}}],
     "stop_reason":"tool_use","stop_sequence":null,"usage":{"input_tokens":30,"output_tokens":9}}"#;
    let up = upstream(json(200, TOOL_USE)).await;
    let provider = upstream::provider("anthropic", &up.base_url);
    let mut req = request();
    let mut call = Message::new(Role::Assistant, "");
    call.tool_calls = Some(vec![json!({"id": "call_9", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}})]);
    let mut result = Message::new(Role::Tool, "{\"temp_c\": 18}");
    result.tool_call_id = Some("call_9".into());
    req.messages.extend([call, result]);
    req.options.tools = Some(vec![json!({"type": "function", "function": {
        "name": "get_weather", "description": "Weather", "parameters": {"type": "object"}}})]);
    req.options.tool_choice = Some(json!("required"));
    req.options.stop = Some(vec!["END".into()]);
    req.options.user = Some("u-1".into());
    let outcome = provider.call(&req).await;
    let AttemptOutcome::Succeeded(success) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        success.tool_calls,
        vec![json!({"id": "toolu_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}})]
    );
    let sent = &up.seen()[0].body;
    assert_eq!(
        sent["tools"],
        json!([{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object"}}])
    );
    assert_eq!(sent["tool_choice"], json!({"type": "any"}));
    assert_eq!(sent["stop_sequences"], json!(["END"]));
    assert_eq!(sent["metadata"], json!({"user_id": "u-1"}));
    let messages = sent["messages"].as_array().unwrap();
    let n = messages.len();
    assert_eq!(
        messages[n - 2],
        json!({"role": "assistant", "content": [{"type": "tool_use", "id": "call_9",
               "name": "get_weather", "input": {"city": "Paris"}}]})
    );
    assert_eq!(
        messages[n - 1],
        json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_9",
               "content": "{\"temp_c\": 18}"}]})
    );
}

#[tokio::test]
async fn what_the_anthropic_wire_cannot_express_is_never_sent() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("anthropic", &up.base_url);
    let mut req = request();
    req.options.seed = Some(7);
    let outcome = provider.call(&req).await;
    assert!(
        matches!(&outcome, AttemptOutcome::Failed(f) if !f.retryable && f.message.contains("seed")),
        "{outcome:?}"
    );
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn why_the_model_stopped_is_kept_with_the_answer() {
    let answer = |stop_reason: &str, stop_sequence: &str| {
        format!(
            r#"{{"id":"msg_2","type":"message","role":"assistant","model":"m",
             "content":[{{"type":"text","text":"Once upon"}}],"stop_reason":"{stop_reason}",
             "stop_sequence":{stop_sequence},"usage":{{"input_tokens":5,"output_tokens":2}}}}"#
        )
    };
    for (stop_reason, stop_sequence, expected) in [
        ("max_tokens", "null", FinishReason::Length),
        (
            "stop_sequence",
            "\"END\"",
            FinishReason::StopSequence(Some("END".into())),
        ),
        ("end_turn", "null", FinishReason::Stop),
    ] {
        let up = upstream(json(200, &answer(stop_reason, stop_sequence))).await;
        let provider = upstream::provider("anthropic", &up.base_url);
        let AttemptOutcome::Succeeded(success) = provider.call(&request()).await else {
            panic!("{stop_reason}: an answer")
        };
        assert_eq!(success.finish, Some(expected), "{stop_reason}");
    }
}

#[tokio::test]
async fn a_streamed_stop_sequence_is_kept_with_its_sequence() {
    let events = [
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_3","type":"message","role":"assistant","model":"m","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":5,"output_tokens":1}}}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"stop_sequence","stop_sequence":"END"},"usage":{"output_tokens":2}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ];
    let body: String = events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect();
    let up = upstream(json(200, &body)).await;
    let provider = upstream::provider("anthropic", &up.base_url);
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let (outcome, finish) = provider.stream(&request(), &tx).await;
    let AttemptOutcome::Succeeded(success) = outcome else {
        panic!("{outcome:?}")
    };
    let sequence = FinishReason::StopSequence(Some("END".into()));
    assert_eq!(success.finish, Some(sequence.clone()));
    assert_eq!(finish.unwrap().finish_reason, sequence);
}

#[tokio::test]
async fn a_request_without_a_limit_carries_the_files_default_max_tokens() {
    let up = upstream(json(200, SUCCESS)).await;
    let unlimited = onejob::providers::ChatRequest {
        max_tokens: None,
        ..request()
    };
    upstream::provider("anthropic", &up.base_url)
        .call(&unlimited)
        .await;
    let config = upstream::config("anthropic", &up.base_url, "default_max_tokens = 2000");
    let tuned = onejob::providers::build_provider("tuned", &config).unwrap();
    tuned.call(&unlimited).await;
    tuned.call(&request()).await;
    let sent: Vec<serde_json::Value> = up
        .seen()
        .iter()
        .map(|s| s.body["max_tokens"].clone())
        .collect();
    assert_eq!(sent, vec![json!(4096), json!(2000), json!(64)]);
}

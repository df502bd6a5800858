//! The Gemini adapter against fake upstreams speaking Google's published
//! `generateContent` / `streamGenerateContent?alt=sse` formats (AI Studio),
//! and Vertex AI's, with a fake OAuth token endpoint that checks the
//! service account's RS256 assertion the way Google does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod upstream;

use onejob::domain::request::{Message, Role};
use onejob::domain::FinishReason;
use onejob::providers::stream::Delta;
use onejob::providers::{build_provider, AttemptOutcome, ChatRequest, Lookup, Provider, Streamed};
use serde_json::{json, Value};
use std::time::Duration;
use tokio::sync::mpsc;
use upstream::{json, json_with, request, run_rows, transport_rows, upstream, Expect, Row};

const SUCCESS: &str = r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"{\"a\":"},{"text":"\"x\"}"}]},
 "finishReason":"STOP","index":0,"safetyRatings":[{"category":"HARM_CATEGORY_HARASSMENT","probability":"NEGLIGIBLE"}]}],
 "usageMetadata":{"promptTokenCount":21,"candidatesTokenCount":5,"totalTokenCount":26},
 "modelVersion":"gemini-2.0-flash","responseId":"resp-1"}"#;

fn error(code: u16, status: &str, message: &str) -> String {
    format!(r#"{{"error":{{"code":{code},"message":"{message}","status":"{status}"}}}}"#)
}

fn finished(reason: &str) -> String {
    format!(
        r#"{{"candidates":[{{"content":{{"role":"model","parts":[{{"text":"partial"}}]}},"finishReason":"{reason}","index":0}}],
        "usageMetadata":{{"promptTokenCount":3,"candidatesTokenCount":1,"totalTokenCount":4}}}}"#
    )
}

fn definitive(kind: &'static str) -> Expect {
    Expect::Failed {
        retryable: false,
        kind,
        retry_after: None,
    }
}

#[tokio::test]
async fn every_answer_class_is_classified_where_it_is_born() {
    let exhausted = r#"{"error":{"code":429,"message":"You exceeded your current quota.","status":"RESOURCE_EXHAUSTED",
      "details":[{"@type":"type.googleapis.com/google.rpc.QuotaFailure","violations":[{"quotaMetric":"generate_content_free_tier_requests"}]},
                 {"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"37s"}]}}"#;
    let mut rows = vec![
        Row {
            name: "200 answer",
            reply: json(200, SUCCESS),
            expect: Expect::Succeeded {
                output: "{\"a\":\"x\"}",
            },
        },
        Row {
            name: "200 cut by MAX_TOKENS is an answer",
            reply: json(200, &finished("MAX_TOKENS")),
            expect: Expect::Succeeded { output: "partial" },
        },
        Row {
            name: "429 RESOURCE_EXHAUSTED with RetryInfo",
            reply: json(429, exhausted),
            expect: Expect::Failed {
                retryable: true,
                kind: "rate_limited",
                retry_after: Some(Duration::from_secs(37)),
            },
        },
        Row {
            name: "400 INVALID_ARGUMENT",
            reply: json(
                400,
                &error(
                    400,
                    "INVALID_ARGUMENT",
                    "Invalid JSON payload received. Unknown name \\\"foo\\\".",
                ),
            ),
            expect: definitive("bad_request"),
        },
        Row {
            name: "400 input too long",
            reply: json(
                400,
                &error(
                    400,
                    "INVALID_ARGUMENT",
                    "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
                ),
            ),
            expect: definitive("context_length_exceeded"),
        },
        Row {
            name: "400 FAILED_PRECONDITION",
            reply: json(
                400,
                &error(
                    400,
                    "FAILED_PRECONDITION",
                    "User location is not supported for the API use.",
                ),
            ),
            expect: definitive("bad_request"),
        },
        Row {
            name: "401 UNAUTHENTICATED",
            reply: json(
                401,
                &error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."),
            ),
            expect: definitive("unauthorized"),
        },
        Row {
            name: "403 PERMISSION_DENIED",
            reply: json(
                403,
                &error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers."),
            ),
            expect: definitive("forbidden"),
        },
        Row {
            name: "404 NOT_FOUND",
            reply: json(
                404,
                &error(404, "NOT_FOUND", "models/nope is not found for API version v1beta"),
            ),
            expect: definitive("not_found"),
        },
        Row {
            name: "500 INTERNAL",
            reply: json(
                500,
                &error(500, "INTERNAL", "An internal error has occurred."),
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "server_error",
                retry_after: None,
            },
        },
        Row {
            name: "503 UNAVAILABLE",
            reply: json(
                503,
                &error(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "unavailable",
                retry_after: None,
            },
        },
        Row {
            name: "504 DEADLINE_EXCEEDED may have run",
            reply: json(
                504,
                &error(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
            ),
            expect: Expect::Unknown { kind: "timeout" },
        },
        Row {
            name: "200 without candidates",
            reply: json(200, r#"{"usageMetadata":{"promptTokenCount":3}}"#),
            expect: Expect::Unknown {
                kind: "invalid_body",
            },
        },
        Row {
            name: "200 prompt blocked",
            reply: json(
                200,
                r#"{"promptFeedback":{"blockReason":"PROHIBITED_CONTENT"},"usageMetadata":{"promptTokenCount":3,"totalTokenCount":3}}"#,
            ),
            expect: definitive("content_policy"),
        },
    ];
    for reason in [
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
    ] {
        rows.push(Row {
            name: "200 stopped on policy grounds",
            reply: json(200, &finished(reason)),
            expect: definitive("content_policy"),
        });
    }
    rows.extend(transport_rows());
    run_rows("gemini", rows).await;
}

#[tokio::test]
async fn request_is_gemini_shaped_with_its_key_header_and_path() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let outcome = provider.call(&request()).await;
    let AttemptOutcome::Succeeded(success) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(success.provider_request_id.as_deref(), Some("resp-1"));
    let usage = success.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens), (21, 5));

    let s = &up.seen()[0];
    assert_eq!(s.uri.path(), "/v1beta/models/test-model:generateContent");
    assert_eq!(s.headers["x-goog-api-key"], upstream::KEY_VALUE);
    assert!(s.headers.get("authorization").is_none());
    assert_eq!(s.headers["idempotency-key"], "onejob-test-key");
    assert_eq!(
        s.body["systemInstruction"],
        json!({"parts": [{"text": "Answer in JSON."}]})
    );
    assert_eq!(
        s.body["contents"],
        json!([{"role": "user", "parts": [{"text": "first"}, {"text": "second"}]},
               {"role": "model", "parts": [{"text": "ok"}]},
               {"role": "user", "parts": [{"text": "third"}]}])
    );
    assert_eq!(
        s.body["generationConfig"],
        json!({"temperature": 0.0, "maxOutputTokens": 64,
               "responseMimeType": "application/json",
               "responseSchema": {"type": "OBJECT", "properties": {"a": {"type": "STRING"}},
                                  "required": ["a"]}})
    );
    assert!(s.body.get("model").is_none(), "the model is in the path");
}

#[tokio::test]
async fn tools_and_tool_turns_are_carried_in_geminis_terms() {
    const CALL: &str = r#"{"candidates":[{"content":{"role":"model","parts":[
        {"functionCall":{"name":"get_weather","args":{"city":"Oslo"}}}]},"finishReason":"STOP","index":0}],
        "usageMetadata":{"promptTokenCount":30,"candidatesTokenCount":9,"totalTokenCount":39}}"#;
    let up = upstream(json(200, CALL)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let mut req = request();
    req.response_schema = None;
    let mut call = Message::new(Role::Assistant, "");
    call.tool_calls = Some(vec![json!({"id": "call_9", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}})]);
    let mut result = Message::new(Role::Tool, "{\"temp_c\": 18}");
    result.tool_call_id = Some("call_9".into());
    req.messages.extend([call, result]);
    req.options.tools = Some(vec![json!({"type": "function", "function": {
        "name": "get_weather", "description": "Weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "additionalProperties": false}}})]);
    req.options.tool_choice =
        Some(json!({"type": "function", "function": {"name": "get_weather"}}));
    req.options.stop = Some(vec!["END".into()]);
    req.options.seed = Some(7);
    let outcome = provider.call(&req).await;
    let AttemptOutcome::Succeeded(success) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(success.tool_calls.len(), 1);
    assert_eq!(
        success.tool_calls[0]["function"],
        json!({"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"})
    );
    assert_eq!(success.tool_calls[0]["type"], "function");
    // Gemini stops a call with STOP: a tool-call turn, as its stream says.
    assert_eq!(success.finish, Some(FinishReason::ToolCalls));
    let sent = &up.seen()[0].body;
    assert_eq!(
        sent["tools"],
        json!([{"functionDeclarations": [{"name": "get_weather", "description": "Weather",
            "parameters": {"type": "OBJECT", "properties": {"city": {"type": "STRING"}}}}]}])
    );
    assert_eq!(
        sent["toolConfig"],
        json!({"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}})
    );
    assert_eq!(sent["generationConfig"]["stopSequences"], json!(["END"]));
    assert_eq!(sent["generationConfig"]["seed"], 7);
    let contents = sent["contents"].as_array().unwrap();
    let n = contents.len();
    assert_eq!(
        contents[n - 2],
        json!({"role": "model", "parts": [{"functionCall": {"name": "get_weather",
               "args": {"city": "Paris"}}}]})
    );
    assert_eq!(
        contents[n - 1],
        json!({"role": "user", "parts": [{"functionResponse": {"name": "get_weather",
               "response": {"temp_c": 18}}}]})
    );
}

/// A Gemini answer that calls `function` without an `id`, as Gemini
/// answers most calls.
fn calls(function: &str) -> String {
    format!(
        r#"{{"candidates":[{{"content":{{"role":"model","parts":[
        {{"functionCall":{{"name":"{function}","args":{{}}}}}}]}},"finishReason":"STOP","index":0}}],
        "usageMetadata":{{"promptTokenCount":30,"candidatesTokenCount":9,"totalTokenCount":39}}}}"#
    )
}

/// A tool loop: each step is its own job (its own idempotency key); Gemini
/// names no call ids. The ids onejob makes differ between steps, so the
/// body of the third step sends each tool result back under the function
/// that was called: `get_weather`'s as `get_weather`, `get_time`'s as
/// `get_time` (both ids were `call_0` once, and both results went back as
/// `get_weather`).
#[tokio::test]
async fn a_tool_loop_sends_each_result_back_under_its_own_function() {
    let mut conversation = vec![Message::new(Role::User, "weather and time in Oslo?")];
    let mut ids = Vec::new();
    for (step, function, streamed_answer) in [(1, "get_weather", false), (2, "get_time", true)] {
        let mut req = request();
        req.response_schema = None;
        req.idempotency_key = format!("onejob-step-{step}");
        req.messages = conversation.clone();
        let call = if streamed_answer {
            let up = upstream(json(200, &sse(&[&calls(function)]))).await;
            let provider = upstream::provider("gemini", &up.base_url);
            let ((outcome, _), _) = streamed(provider.as_ref(), &req).await;
            let AttemptOutcome::Succeeded(success) = outcome else {
                panic!("{outcome:?}")
            };
            success.tool_calls[0].clone()
        } else {
            let up = upstream(json(200, &calls(function))).await;
            let provider = upstream::provider("gemini", &up.base_url);
            let outcome = provider.call(&req).await;
            let AttemptOutcome::Succeeded(success) = outcome else {
                panic!("{outcome:?}")
            };
            success.tool_calls[0].clone()
        };
        assert_eq!(call["function"]["name"], function);
        let id = call["id"].as_str().unwrap().to_string();
        let mut turn = Message::new(Role::Assistant, "");
        turn.tool_calls = Some(vec![call]);
        let mut result = Message::new(Role::Tool, format!("result of {function}"));
        result.tool_call_id = Some(id.clone());
        conversation.extend([turn, result]);
        ids.push(id);
    }
    assert_ne!(ids[0], ids[1], "a made call id repeated across steps");

    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let mut req = request();
    req.response_schema = None;
    req.idempotency_key = "onejob-step-3".into();
    req.messages = conversation;
    let outcome = provider.call(&req).await;
    assert!(
        matches!(outcome, AttemptOutcome::Succeeded(_)),
        "{outcome:?}"
    );
    let sent = &up.seen()[0].body;
    let answered: Vec<&Value> = sent["contents"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|c| c["parts"].as_array().unwrap())
        .filter_map(|p| p.get("functionResponse"))
        .collect();
    assert_eq!(
        answered,
        vec![
            &json!({"name": "get_weather", "response": {"output": "result of get_weather"}}),
            &json!({"name": "get_time", "response": {"output": "result of get_time"}}),
        ],
        "{sent}"
    );
}

#[tokio::test]
async fn a_conversation_gemini_cannot_express_is_never_sent() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let mut req = request();
    let mut orphan = Message::new(Role::Tool, "42");
    orphan.tool_call_id = Some("call_unknown".into());
    req.messages.push(orphan);
    let outcome = provider.call(&req).await;
    assert!(
        matches!(&outcome, AttemptOutcome::Failed(f) if !f.retryable && f.kind == "invalid_prompt"),
        "{outcome:?}"
    );
    assert!(up.seen().is_empty());
}

#[tokio::test]
async fn gemini_cannot_tell_by_key() {
    let up = upstream(json(200, SUCCESS)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    assert!(matches!(provider.lookup("k").await, Lookup::CannotTell(m) if m.contains("no lookup")));
    assert!(up.seen().is_empty());
}

async fn streamed(provider: &dyn Provider, request: &ChatRequest) -> (Streamed, Vec<Delta>) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let outcome = provider.stream(request, &tx).await;
    drop(tx);
    let mut pieces = Vec::new();
    while let Some(heard) = rx.recv().await {
        pieces.extend(heard.piece());
    }
    (outcome, pieces)
}

/// Server-sent events of whole JSON chunks, one line each, as Google sends them.
fn sse(events: &[&str]) -> String {
    events
        .iter()
        .map(|e| format!("data: {}\r\n\r\n", e.replace('\n', "")))
        .collect()
}

#[tokio::test]
async fn a_stream_ends_at_the_close_after_its_finish_reason() {
    let body = sse(&[
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]},"index":0}],"responseId":"r-9"}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"lo"}]},"index":0}]}"#,
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":""}]},"finishReason":"STOP","index":0}],
           "usageMetadata":{"promptTokenCount":9,"candidatesTokenCount":2,"totalTokenCount":11}}"#,
    ]);
    let up = upstream(json(200, &body)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let ((outcome, finish), pieces) = streamed(provider.as_ref(), &request()).await;
    let text: String = pieces.iter().map(|d| d.content.as_str()).collect();
    assert_eq!(text, "Hello");
    let AttemptOutcome::Succeeded(s) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(s.output, "Hello");
    assert_eq!(s.provider_request_id.as_deref(), Some("r-9"));
    assert_eq!(s.usage.unwrap().prompt_tokens, 9);
    assert_eq!(finish.unwrap().finish_reason.name(), "stop");
    let seen = &up.seen()[0];
    assert_eq!(
        seen.uri.path(),
        "/v1beta/models/test-model:streamGenerateContent"
    );
    assert_eq!(seen.uri.query(), Some("alt=sse"));
    assert_eq!(seen.headers["x-goog-api-key"], upstream::KEY_VALUE);
}

#[tokio::test]
async fn a_streamed_function_call_is_a_whole_tool_call() {
    let body = sse(&[
        r#"{"candidates":[{"content":{"role":"model","parts":[{"functionCall":{"name":"lookup","args":{"q":1}}}]},
           "finishReason":"STOP","index":0}],"usageMetadata":{"promptTokenCount":4,"candidatesTokenCount":3}}"#,
    ]);
    let up = upstream(json(200, &body)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let ((outcome, finish), pieces) = streamed(provider.as_ref(), &request()).await;
    assert_eq!(pieces.len(), 1);
    assert_eq!(pieces[0].tool_calls[0]["index"], 0);
    let AttemptOutcome::Succeeded(s) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(s.tool_calls.len(), 1);
    assert_eq!(
        s.tool_calls[0]["function"],
        json!({"name": "lookup", "arguments": "{\"q\":1}"})
    );
    // The streamed call's id is the one its piece named.
    assert_eq!(s.tool_calls[0]["id"], pieces[0].tool_calls[0]["id"]);
    assert_eq!(finish.unwrap().finish_reason.name(), "tool_calls");
}

#[tokio::test]
async fn a_stream_that_breaks_is_unknown_and_a_safety_stop_is_a_refusal() {
    let closes_early = sse(&[
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]},"index":0}]}"#,
    ]);
    let safety = sse(&[
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]},"index":0}]}"#,
        r#"{"candidates":[{"finishReason":"SAFETY","index":0,"safetyRatings":[{"category":"HARM_CATEGORY_DANGEROUS_CONTENT","probability":"HIGH","blocked":true}]}]}"#,
    ]);
    let error_event = sse(&[
        r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"Hel"}]},"index":0}]}"#,
        r#"{"error":{"code":500,"message":"An internal error has occurred.","status":"INTERNAL"}}"#,
    ]);
    for (name, body, expected) in [
        (
            "closed before a finish reason",
            closes_early,
            "stream_incomplete",
        ),
        ("an error event mid-stream", error_event, "stream_error"),
        (
            "a malformed event",
            "data: {\"candidates\": [\r\n\r\n".to_string(),
            "malformed_chunk",
        ),
    ] {
        let up = upstream(json(200, &body)).await;
        let provider = upstream::provider("gemini", &up.base_url);
        let ((outcome, finish), _) = streamed(provider.as_ref(), &request()).await;
        assert!(finish.is_none(), "{name}");
        assert!(
            matches!(&outcome, AttemptOutcome::Unknown(a) if a.kind == expected),
            "{name}: {outcome:?}"
        );
    }
    let up = upstream(json(200, &safety)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let ((outcome, _), _) = streamed(provider.as_ref(), &request()).await;
    assert!(
        matches!(&outcome, AttemptOutcome::Failed(f) if !f.retryable && f.kind == "content_policy"
            && f.message.contains("SAFETY")),
        "{outcome:?}"
    );

    let exhausted = r#"{"error":{"code":429,"message":"Quota exceeded","status":"RESOURCE_EXHAUSTED",
      "details":[{"@type":"type.googleapis.com/google.rpc.RetryInfo","retryDelay":"1.5s"}]}}"#;
    let up = upstream(json_with(429, vec![], exhausted)).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let ((outcome, _), pieces) = streamed(provider.as_ref(), &request()).await;
    assert!(pieces.is_empty());
    let AttemptOutcome::Failed(f) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(f.retryable && f.kind == "rate_limited", "{f:?}");
    assert_eq!(f.retry_after, Some(Duration::from_millis(1500)));
    assert!(f.message.starts_with("RESOURCE_EXHAUSTED: "), "{f:?}");
}

#[tokio::test]
async fn count_tokens_sends_the_whole_request_and_reads_total_tokens() {
    let up = upstream(json(
        200,
        r#"{"totalTokens": 31, "promptTokensDetails": []}"#,
    ))
    .await;
    let provider = upstream::provider("gemini", &up.base_url);
    assert_eq!(provider.count_tokens(&request()).await, Some(Ok(31)));
    let s = &up.seen()[0];
    assert_eq!(s.uri.path(), "/v1beta/models/test-model:countTokens");
    let counted = &s.body["generateContentRequest"];
    assert_eq!(counted["model"], "models/test-model");
    assert_eq!(
        counted["systemInstruction"]["parts"][0]["text"],
        "Answer in JSON."
    );
    assert_eq!(counted["contents"].as_array().unwrap().len(), 3);
    assert!(counted.get("generationConfig").is_none());

    let up = upstream(json(403, &error(403, "PERMISSION_DENIED", "no"))).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let counted = provider.count_tokens(&request()).await.unwrap();
    assert!(counted.unwrap_err().contains("HTTP 403"));
}

/// A Vertex provider's file, its service account pointing at `token_uri`.
fn vertex_provider(
    dir: &std::path::Path,
    base_url: &str,
    token_uri: &str,
) -> std::sync::Arc<dyn Provider> {
    let key = std::fs::read_to_string(fixture("vertex-test-key.pem")).unwrap();
    let account = json!({"type": "service_account", "project_id": "proj-1",
        "private_key_id": "kid-1", "private_key": key,
        "client_email": "onejob@proj-1.iam.gserviceaccount.com", "token_uri": token_uri});
    let path = dir.join("sa.json");
    std::fs::write(&path, account.to_string()).unwrap();
    // One variable per provider: the tests of this binary run at once in one
    // process, and a shared name would hand one test another's token server.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let var = format!(
        "ONEJOB_TEST_VERTEX_CREDENTIALS_{}",
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    std::env::set_var(&var, &path);
    let text = format!(
        "kind = \"gemini\"\nbase_url = \"{base_url}\"\nmodel = \"gemini-2.0-flash\"\n\
         vertex_project = \"proj-1\"\nvertex_location = \"europe-west4\"\n\
         credentials_env = \"{var}\"\n\
         tokenizer = \"o200k_base\"\ncontext_window = 8192\n"
    );
    let config = onejob::providers::config::ProviderConfig::parse(
        &text,
        std::path::Path::new("providers/vertex.toml"),
    )
    .unwrap();
    build_provider("vertex", &config).unwrap()
}

fn fixture(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

mod vertex {
    //! A fake Google: `POST /token` checks the JWT-bearer grant (signature
    //! by the test key's public half, issuer, audience, scope, lifetime)
    //! and issues tokens `tok-1`, `tok-2`, …; the Vertex generateContent
    //! path answers only a bearer of the latest token.
    use super::*;
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use base64::Engine;
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    pub struct Google {
        pub token_requests: Mutex<Vec<Value>>,
        pub calls: Mutex<Vec<String>>,
        pub expires_in: u64,
        pub refuse_grant: bool,
        pub token_uri: Mutex<String>,
    }

    fn public_key() -> Vec<u8> {
        let pem = std::fs::read_to_string(fixture("vertex-test-key.pub.pem")).unwrap();
        onejob::providers::vertex_auth::pem_body(&pem, "RSA PUBLIC KEY").unwrap()
    }

    async fn token(
        State(g): State<Arc<Google>>,
        headers: HeaderMap,
        body: String,
    ) -> axum::response::Response {
        assert_eq!(headers["content-type"], "application/x-www-form-urlencoded");
        let form: std::collections::HashMap<String, String> = body
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_string(), v.replace("%3A", ":")))
            .collect();
        assert_eq!(
            form["grant_type"],
            "urn:ietf:params:oauth:grant-type:jwt-bearer"
        );
        let jwt = &form["assertion"];
        let (signed, signature) = jwt.rsplit_once('.').unwrap();
        let key = ring::signature::UnparsedPublicKey::new(
            &ring::signature::RSA_PKCS1_2048_8192_SHA256,
            public_key(),
        );
        key.verify(
            signed.as_bytes(),
            &URL_SAFE_NO_PAD.decode(signature).unwrap(),
        )
        .expect("the assertion is signed by the service account's key");
        let (header, claims) = signed.split_once('.').unwrap();
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(header).unwrap()).unwrap();
        let claims: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
        assert_eq!(
            header,
            json!({"alg": "RS256", "typ": "JWT", "kid": "kid-1"})
        );
        assert_eq!(claims["iss"], "onejob@proj-1.iam.gserviceaccount.com");
        assert_eq!(claims["aud"], *g.token_uri.lock().unwrap());
        assert_eq!(
            claims["scope"],
            "https://www.googleapis.com/auth/cloud-platform"
        );
        assert_eq!(
            claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
            3600
        );
        let mut requests = g.token_requests.lock().unwrap();
        requests.push(claims);
        if g.refuse_grant {
            return (
                StatusCode::BAD_REQUEST,
                axum::Json(json!({"error": "invalid_grant", "error_description": "Invalid JWT Signature."})),
            )
                .into_response();
        }
        axum::Json(json!({"access_token": format!("tok-{}", requests.len()),
            "expires_in": g.expires_in, "token_type": "Bearer"}))
        .into_response()
    }

    async fn generate(
        State(g): State<Arc<Google>>,
        headers: HeaderMap,
    ) -> axum::response::Response {
        let bearer = headers["authorization"].to_str().unwrap().to_string();
        let latest = format!("Bearer tok-{}", g.token_requests.lock().unwrap().len());
        g.calls.lock().unwrap().push(bearer.clone());
        if bearer != latest {
            return (
                StatusCode::UNAUTHORIZED,
                error(401, "UNAUTHENTICATED", "stale token"),
            )
                .into_response();
        }
        ([("content-type", "application/json")], SUCCESS).into_response()
    }

    pub async fn start(expires_in: u64, refuse_grant: bool) -> (String, Arc<Google>) {
        let google = Arc::new(Google {
            expires_in,
            refuse_grant,
            ..Google::default()
        });
        let app = axum::Router::new()
            .route("/token", axum::routing::post(token))
            .route(
                "/v1/projects/proj-1/locations/europe-west4/publishers/google/models/{method}",
                axum::routing::post(generate),
            )
            .with_state(google.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        *google.token_uri.lock().unwrap() = format!("{base}/token");
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (base, google)
    }
}

#[tokio::test]
async fn vertex_exchanges_a_signed_assertion_for_a_token_and_reuses_it() {
    let (base, google) = vertex::start(3600, false).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = vertex_provider(dir.path(), &base, &format!("{base}/token"));
    for _ in 0..3 {
        let outcome = provider.call(&request()).await;
        assert!(
            matches!(outcome, AttemptOutcome::Succeeded(_)),
            "{outcome:?}"
        );
    }
    assert_eq!(
        google.token_requests.lock().unwrap().len(),
        1,
        "one token for three calls"
    );
    assert_eq!(*google.calls.lock().unwrap(), vec!["Bearer tok-1"; 3]);
}

#[tokio::test]
async fn vertex_fetches_a_new_token_before_the_old_one_expires() {
    // 60 s left is inside the refresh margin: every call needs a new token.
    let (base, google) = vertex::start(60, false).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = vertex_provider(dir.path(), &base, &format!("{base}/token"));
    for _ in 0..2 {
        let outcome = provider.call(&request()).await;
        assert!(
            matches!(outcome, AttemptOutcome::Succeeded(_)),
            "{outcome:?}"
        );
    }
    assert_eq!(google.token_requests.lock().unwrap().len(), 2);
    assert_eq!(
        *google.calls.lock().unwrap(),
        vec!["Bearer tok-1".to_string(), "Bearer tok-2".to_string()]
    );
}

#[tokio::test]
async fn a_refused_grant_fails_the_call_before_anything_is_sent() {
    let (base, google) = vertex::start(3600, true).await;
    let dir = tempfile::tempdir().unwrap();
    let provider = vertex_provider(dir.path(), &base, &format!("{base}/token"));
    let outcome = provider.call(&request()).await;
    let AttemptOutcome::Failed(f) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(!f.retryable && f.kind == "unauthorized", "{f:?}");
    assert!(f.message.contains("invalid_grant"), "{f:?}");
    assert!(
        google.calls.lock().unwrap().is_empty(),
        "no inference was sent"
    );
    let shown = format!("{f:?} {provider:?}", provider = provider.name());
    assert!(!shown.contains("PRIVATE KEY"));
}

#[tokio::test]
async fn a_max_tokens_stop_is_a_length_finish_whole_and_streamed() {
    let up = upstream(json(200, &finished("MAX_TOKENS"))).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let AttemptOutcome::Succeeded(whole) = provider.call(&request()).await else {
        panic!("an answer")
    };
    assert_eq!(whole.finish, Some(FinishReason::Length));
    let up = upstream(json(200, &sse(&[&finished("MAX_TOKENS")]))).await;
    let provider = upstream::provider("gemini", &up.base_url);
    let ((outcome, finish), _) = streamed(provider.as_ref(), &request()).await;
    let AttemptOutcome::Succeeded(streamed) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(streamed.finish, Some(FinishReason::Length));
    assert_eq!(finish.unwrap().finish_reason, FinishReason::Length);
}

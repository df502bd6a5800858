//! The OpenAI-compatible servers people run behind a gateway, each from
//! its file in `providers/examples/`: the file loads with the settings that
//! matter, and a fake of that server (its documented stream, its error
//! shape, the fields it refuses) is answered as onejob expects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use onejob::domain::request::{Message, Role};
use onejob::providers::config::{ProviderConfig, ProviderKind};
use onejob::providers::stream::Chunk;
use onejob::providers::{build_provider, AttemptOutcome, ChatRequest, Provider, Streamed};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// How a fake server answers a request body: status, content type, body.
type Answer = fn(&Value) -> (u16, &'static str, String);

#[derive(Clone)]
struct Fake {
    answer: Answer,
    seen: Arc<Mutex<Vec<Value>>>,
}

async fn serve(State(fake): State<Fake>, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.seen.lock().unwrap().push(body.clone());
    let (status, content_type, text) = (fake.answer)(&body);
    let mut response = (StatusCode::from_u16(status).unwrap(), text).into_response();
    response
        .headers_mut()
        .insert("content-type", content_type.parse().unwrap());
    response
}

/// The example file `name`, pointed at a fake that answers with `answer`.
async fn server(name: &str, answer: Answer) -> (Arc<dyn Provider>, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = axum::Router::new().fallback(serve).with_state(Fake {
        answer,
        seen: seen.clone(),
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let mut config = example(name);
    if let Some(var) = &config.api_key_env {
        std::env::set_var(var, "sk-compat-test");
    }
    config.base_url = format!("http://{address}");
    (build_provider(name, &config).unwrap(), seen)
}

fn example(name: &str) -> ProviderConfig {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("providers/examples")
        .join(format!("{name}.toml"));
    ProviderConfig::load(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn ask() -> ChatRequest {
    let mut named = Message::new(Role::User, "Say hello.");
    named.name = Some("ada".into());
    ChatRequest {
        system: Some("Be brief.".into()),
        messages: vec![named],
        temperature: Some(0.0),
        max_tokens: Some(32),
        top_p: None,
        response_schema: None,
        idempotency_key: format!("k-{}", uuid::Uuid::new_v4()),
        options: onejob::providers::ChatOptions {
            user: Some("user-7".into()),
            ..Default::default()
        },
    }
}

async fn streamed(provider: &dyn Provider) -> (Streamed, String) {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let outcome = provider.stream(&ask(), &tx).await;
    drop(tx);
    let mut text = String::new();
    while let Some(d) = rx.recv().await.map(Chunk::piece) {
        text.push_str(&d.unwrap_or_default().content);
    }
    (outcome, text)
}

const SSE: &str = "text/event-stream";
const JSON: &str = "application/json";

fn chunk(delta: Value, finish: Value, usage: Option<Value>) -> String {
    let mut c = json!({"id": "chatcmpl-c", "object": "chat.completion.chunk", "created": 1,
                       "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
    if let Some(u) = usage {
        c["usage"] = u;
    }
    format!("data: {c}\n\n")
}

fn usage() -> Value {
    json!({"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11})
}

/// "Hello there." in two pieces, the finish, then (as asked) a usage chunk
/// and `[DONE]`: the stream as vLLM, Ollama, llama.cpp, Groq and DeepSeek
/// send it when `stream_options.include_usage` is set.
fn openai_stream(body: &Value) -> String {
    let mut s = chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
        None,
    );
    s += &chunk(json!({"content": "Hello "}), Value::Null, None);
    s += &chunk(json!({"content": "there."}), Value::Null, None);
    s += &chunk(json!({}), json!("stop"), None);
    if body["stream_options"]["include_usage"] == true {
        s += &format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-c", "object": "chat.completion.chunk", "created": 1,
                   "model": "m", "choices": [], "usage": usage()})
        );
    }
    s + "data: [DONE]\n\n"
}

fn completion() -> String {
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
           "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there."},
                        "finish_reason": "stop"}], "usage": usage()})
    .to_string()
}

fn plain(body: &Value) -> (u16, &'static str, String) {
    if body["stream"] == true {
        (200, SSE, openai_stream(body))
    } else {
        (200, JSON, completion())
    }
}

fn assert_whole((outcome, text): &(Streamed, String), server: &str) {
    assert_eq!(text, "Hello there.", "{server}");
    match &outcome.0 {
        AttemptOutcome::Succeeded(s) => {
            assert_eq!(s.output, "Hello there.", "{server}");
            let usage = s.usage.expect("usage in the stream");
            assert_eq!(
                (usage.prompt_tokens, usage.completion_tokens),
                (9, 2),
                "{server}"
            );
        }
        other => panic!("{server}: {other:?}"),
    }
    assert_eq!(
        outcome.1.as_ref().unwrap().finish_reason.name(),
        "stop",
        "{server}"
    );
}

fn failed_kind(outcome: &AttemptOutcome) -> &str {
    match outcome {
        AttemptOutcome::Failed(f) => f.kind.as_str(),
        other => panic!("not a failure: {other:?}"),
    }
}

/// Each file is an OpenAI-wire provider that neither dedups by key nor
/// looks an attempt up, with the settings its server needs.
#[test]
fn every_compatible_server_has_a_file_with_the_settings_that_matter() {
    // (file, supports_prefill, accepts_images, stream_usage, refuses)
    for (name, prefill, images, stream_usage, refuses) in [
        ("vllm", false, false, true, &[][..]),
        ("ollama", false, false, true, &[]),
        ("llama_cpp", true, false, true, &[]),
        ("openrouter", true, true, true, &[]),
        ("groq", false, false, true, &["name", "reasoning_effort"]),
        ("together", false, false, true, &[]),
        ("deepseek", false, false, true, &[]),
        ("mistral", false, false, false, &["user", "name", "seed"]),
    ] {
        let config = example(name);
        assert_eq!(config.kind, ProviderKind::Openai, "{name}");
        assert!(!config.honours_idempotency_key, "{name}");
        assert_eq!(config.supports_prefill, Some(prefill), "{name}");
        assert_eq!(config.takes_images(), images, "{name}");
        assert_eq!(config.stream_usage.unwrap_or(true), stream_usage, "{name}");
        for field in refuses {
            assert!(config.refuses.iter().any(|f| f == field), "{name}: {field}");
        }
        assert!(config.context_window >= 4096, "{name}");
        assert!(config.api_key_env.is_some(), "{name}: the key by name");
    }
}

/// The servers that stream as OpenAI does give one whole answer with its
/// usage, plain and streamed.
#[tokio::test]
async fn servers_that_stream_as_openai_does_give_whole_answers_with_usage() {
    for name in ["vllm", "ollama", "llama_cpp", "groq", "together"] {
        let (provider, seen) = server(name, plain).await;
        assert_whole(&streamed(provider.as_ref()).await, name);
        match provider.call(&ask()).await {
            AttemptOutcome::Succeeded(s) => assert_eq!(s.output, "Hello there.", "{name}"),
            other => panic!("{name}: {other:?}"),
        }
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{name}");
        assert_eq!(seen[0]["stream_options"]["include_usage"], true, "{name}");
    }
}

/// DeepSeek's keep-alive comments before the first token and OpenRouter's
/// processing comments are skipped; OpenRouter's usage in the finish chunk
/// is read; a mid-stream error chunk is a cut (the work may have run).
#[tokio::test]
async fn comment_lines_are_skipped_and_a_mid_stream_error_is_a_cut() {
    fn keep_alive(body: &Value) -> (u16, &'static str, String) {
        let s = ": keep-alive\n\n: keep-alive\n\n".to_string() + &openai_stream(body);
        (200, SSE, s)
    }
    let (deepseek, _) = server("deepseek", keep_alive).await;
    assert_whole(&streamed(deepseek.as_ref()).await, "deepseek");

    fn processing(_: &Value) -> (u16, &'static str, String) {
        let mut s = ": OPENROUTER PROCESSING\n\n".to_string();
        s += &chunk(
            json!({"role": "assistant", "content": "Hello "}),
            Value::Null,
            None,
        );
        s += &chunk(json!({"content": "there."}), Value::Null, None);
        s += &chunk(json!({}), json!("stop"), Some(usage()));
        (200, SSE, s + "data: [DONE]\n\n")
    }
    let (openrouter, _) = server("openrouter", processing).await;
    assert_whole(&streamed(openrouter.as_ref()).await, "openrouter");

    fn broken(_: &Value) -> (u16, &'static str, String) {
        let mut s = chunk(
            json!({"role": "assistant", "content": "Hel"}),
            Value::Null,
            None,
        );
        let error = json!({"id": "gen-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "error": {"code": 502, "message": "Provider returned error"},
            "choices": [{"index": 0, "delta": {"content": ""}, "finish_reason": "error"}]});
        s += &format!("data: {error}\n\n");
        (200, SSE, s)
    }
    let (cut, _) = server("openrouter", broken).await;
    let ((outcome, finish), text) = streamed(cut.as_ref()).await;
    assert_eq!(text, "Hel");
    assert!(finish.is_none());
    match outcome {
        AttemptOutcome::Unknown(a) => assert_eq!(a.kind, "stream_error"),
        other => panic!("{other:?}"),
    }
}

/// Mistral refuses fields it does not know (422 "Extra inputs are not
/// permitted") and puts the usage in its finish chunk unasked: onejob sends
/// no stream_options and none of the refused fields, and gets the usage.
#[tokio::test]
async fn a_server_that_refuses_fields_is_sent_none_of_them() {
    const KNOWN: &[&str] = &[
        "model",
        "messages",
        "temperature",
        "top_p",
        "max_tokens",
        "stream",
        "stop",
        "random_seed",
        "response_format",
        "tools",
        "tool_choice",
        "presence_penalty",
        "frequency_penalty",
        "n",
        "parallel_tool_calls",
        "prediction",
        "safe_prompt",
    ];
    fn strict(body: &Value) -> (u16, &'static str, String) {
        let extra: Vec<&String> = body
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !KNOWN.contains(&k.as_str()))
            .chain(
                body["messages"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|m| m.as_object().unwrap().keys())
                    .filter(|k| {
                        !["role", "content", "tool_calls", "tool_call_id", "prefix"]
                            .contains(&k.as_str())
                    }),
            )
            .collect();
        if let Some(field) = extra.first() {
            let detail = json!({"object": "error", "type": "invalid_request_error", "code": null,
                "message": {"detail": [{"type": "extra_forbidden", "loc": ["body", field],
                                        "msg": "Extra inputs are not permitted"}]}});
            return (422, JSON, detail.to_string());
        }
        if body["stream"] == true {
            let mut s = chunk(
                json!({"role": "assistant", "content": "Hello "}),
                Value::Null,
                None,
            );
            s += &chunk(json!({"content": "there."}), Value::Null, None);
            s += &chunk(json!({}), json!("stop"), Some(usage()));
            (200, SSE, s + "data: [DONE]\n\n")
        } else {
            (200, JSON, completion())
        }
    }
    let (mistral, seen) = server("mistral", strict).await;
    assert_whole(&streamed(mistral.as_ref()).await, "mistral");
    match mistral.call(&ask()).await {
        AttemptOutcome::Succeeded(s) => assert_eq!(s.output, "Hello there."),
        other => panic!("{other:?}"),
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|b| b.get("stream_options").is_none()));
    assert!(seen.iter().all(|b| b.get("user").is_none()));
    assert!(seen.iter().all(|b| b["messages"][1].get("name").is_none()));
    // Its file names the token-limit field it knows (`max_tokens_field`).
    assert!(
        seen.iter()
            .all(|b| b["max_tokens"] == 32 && b.get("max_completion_tokens").is_none()),
        "{seen:?}"
    );
    // The same server as an unconfigured file would meet it: refused.
    let (unconfigured, _) = server("vllm", strict).await;
    assert_eq!(
        failed_kind(&unconfigured.call(&ask()).await),
        "unprocessable",
        "a 422 is definitive"
    );
}

/// A prompt that does not fit, in each server's own words and shape, is
/// `context_length_exceeded`: the job moves to a larger window instead of
/// retrying where it cannot fit.
#[tokio::test]
async fn each_servers_context_overflow_is_context_length_exceeded() {
    fn vllm(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"object": "error", "type": "BadRequestError", "param": null, "code": 400,
            "message": "This model's maximum context length is 32768 tokens. However, you requested 40000 tokens (39968 in the messages, 32 in the completion)."});
        (400, JSON, e.to_string())
    }
    fn llama_cpp(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"error": {"code": 400, "type": "exceed_context_size_error", "n_prompt_tokens": 9000, "n_ctx": 8192,
            "message": "the request exceeds the available context size, try increasing it"}});
        (400, JSON, e.to_string())
    }
    fn groq(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"error": {"type": "invalid_request_error", "code": "context_length_exceeded",
            "message": "Please reduce the length of the messages or completion."}});
        (400, JSON, e.to_string())
    }
    fn together(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"error": {"type": "invalid_request_error", "param": null, "code": null,
            "message": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 131073. Given: 140000 `inputs` tokens and 32 `max_new_tokens`"}});
        (422, JSON, e.to_string())
    }
    fn mistral(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"object": "error", "type": "invalid_request_error", "param": null, "code": "3051",
            "message": "Prompt contains 140000 tokens and 0 draft tokens, too large for model with 131072 maximum context length"});
        (400, JSON, e.to_string())
    }
    fn deepseek(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"error": {"type": "invalid_request_error", "param": null, "code": "invalid_request_error",
            "message": "This model's maximum context length is 65536 tokens. However, you requested 70000 tokens."}});
        (400, JSON, e.to_string())
    }
    fn openrouter(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"error": {"code": 400, "metadata": {"provider_name": "Anthropic"},
            "message": "This endpoint's maximum context length is 200000 tokens. However, you requested about 210000 tokens."}});
        (400, JSON, e.to_string())
    }
    let servers: [(&str, Answer); 7] = [
        ("vllm", vllm),
        ("llama_cpp", llama_cpp),
        ("groq", groq),
        ("together", together),
        ("mistral", mistral),
        ("deepseek", deepseek),
        ("openrouter", openrouter),
    ];
    for (name, answer) in servers {
        let (provider, _) = server(name, answer).await;
        assert_eq!(
            failed_kind(&provider.call(&ask()).await),
            "context_length_exceeded",
            "{name}"
        );
    }
    // Ollama's native bare-string error is read, and a 404 is definitive.
    fn ollama(_: &Value) -> (u16, &'static str, String) {
        (
            404,
            JSON,
            json!({"error": "model \"llama9\" not found, try pulling it first"}).to_string(),
        )
    }
    let (provider, _) = server("ollama", ollama).await;
    match provider.call(&ask()).await {
        AttemptOutcome::Failed(f) => {
            assert_eq!(f.kind, "not_found");
            assert!(f.message.contains("try pulling it first"), "{}", f.message);
            assert!(!f.retryable);
        }
        other => panic!("{other:?}"),
    }
    // OpenRouter's 402 (no credits) is definitive: no retry can pay for it.
    fn credits(_: &Value) -> (u16, &'static str, String) {
        let e = json!({"error": {"code": 402, "message": "Insufficient credits"}});
        (402, JSON, e.to_string())
    }
    let (provider, _) = server("openrouter", credits).await;
    match provider.call(&ask()).await {
        AttemptOutcome::Failed(f) => assert!(!f.retryable, "{f:?}"),
        other => panic!("{other:?}"),
    }
}

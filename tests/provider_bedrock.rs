//! The Bedrock adapter against a fake Bedrock runtime on a real socket,
//! built from AWS's Converse / ConverseStream API reference: it recomputes
//! every request's SigV4 signature the way AWS does (from the request it
//! received, with the suite's test credentials) and refuses a mismatch as
//! AWS does; it answers in Converse's JSON, streams in AWS's binary
//! event-stream framing (CRCs computed here, independently of onejob's
//! code), and errs with `x-amzn-ErrorType` and `{"message"}`. Its ledger is
//! every request it received.
//!
//! Through onejob's `/v1/chat/completions` (on both backends): plain and
//! streamed answers, tool calls both ways, `json_schema`, and every error
//! class, asserting what the client got and how many requests the fake saw.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Uri};
use axum::response::{IntoResponse, Response};
use common::world::{route, start_world, World};
use common::Backend;
use onejob::domain::request::{Message, Role};
use onejob::domain::FinishReason;
use onejob::providers::config::ProviderConfig;
use onejob::providers::{build_provider, AttemptOutcome, ChatRequest, Lookup, Provider};
use ring::{digest, hmac};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

on_both_backends!(
    a_plain_answer_comes_back_through_chat_completions,
    a_streamed_answer_arrives_in_pieces_through_chat_completions,
    tool_calls_come_back_whole_and_streamed,
    a_json_schema_answer_is_the_forced_tools_input,
    throttling_and_503_are_retried_and_then_answered,
    a_validation_error_is_definitive_and_input_too_long_is_context_length,
    an_exception_frame_or_a_bad_crc_is_a_cut_stream,
    a_request_signed_with_the_wrong_secret_is_refused_once,
);

// ---------------------------------------------------------------- the fake

const ACCESS_KEY_ID: &str = "AKIDEXAMPLE";
const SECRET: &str = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY";
const SESSION_TOKEN: &str = "session-token-for-the-fake";
const REGION: &str = "us-east-1";
const MODEL: &str = "us.anthropic.claude-3-5-sonnet-20241022-v2:0";
const SIGNATURE_MISMATCH: &str = "The request signature we calculated does not match the \
    signature you provided. Check your AWS Secret Access Key and signing method. Consult the \
    service documentation for details.";

/// How the fake answers one request.
#[derive(Debug, Clone)]
enum Reply {
    /// A JSON body; `error_type` goes in `x-amzn-ErrorType` (with the URL
    /// AWS appends).
    Json {
        status: u16,
        error_type: Option<&'static str>,
        body: Value,
    },
    /// An event stream: each element one chunk on the wire.
    Stream(Vec<Vec<u8>>),
}

/// A request as the fake received it.
#[derive(Debug, Clone)]
struct Received {
    /// The path exactly as sent (percent-encoded).
    path: String,
    headers: HeaderMap,
    body: Value,
    signature_ok: bool,
}

#[derive(Default)]
struct Fake {
    replies: Mutex<VecDeque<Reply>>,
    last: Mutex<Option<Reply>>,
    received: Mutex<Vec<Received>>,
}

struct FakeBedrock {
    base_url: String,
    state: Arc<Fake>,
}

impl FakeBedrock {
    /// The fake answers with `replies` in turn, repeating the last.
    async fn start(replies: Vec<Reply>) -> FakeBedrock {
        let state = Arc::new(Fake {
            replies: Mutex::new(replies.into()),
            ..Fake::default()
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        FakeBedrock { base_url, state }
    }

    /// The ledger: every request received, in order.
    fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, bytes))
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
        .as_ref()
        .to_vec()
}

/// RFC 3986 encoding as AWS's canonical request uses it.
fn aws_encode(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// AWS's check of a SigV4 `Authorization` header, recomputed from the
/// request as received: the canonical URI is the received path with each
/// segment encoded once more (non-S3 services), the canonical headers those
/// the signature names, the payload hash that of the body as received.
fn signature_matches(method: &Method, uri: &Uri, headers: &HeaderMap, body: &[u8]) -> bool {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let Some(authorization) = header("authorization") else {
        return false;
    };
    let Some(rest) = authorization.strip_prefix("AWS4-HMAC-SHA256 ") else {
        return false;
    };
    let field = |name: &str| {
        rest.split(", ")
            .find_map(|part| part.strip_prefix(&format!("{name}=")))
    };
    let (Some(credential), Some(signed), Some(given)) = (
        field("Credential"),
        field("SignedHeaders"),
        field("Signature"),
    ) else {
        return false;
    };
    let parts: Vec<&str> = credential.split('/').collect();
    let [key_id, date, region, service, "aws4_request"] = parts.as_slice() else {
        return false;
    };
    let Some(amz_date) = header("x-amz-date") else {
        return false;
    };
    let payload_hash = sha256_hex(body);
    if header("x-amz-content-sha256").is_some_and(|h| h != payload_hash) {
        return false;
    }
    let signed_names: Vec<&str> = signed.split(';').collect();
    if *key_id != ACCESS_KEY_ID
        || *region != REGION
        || *service != "bedrock"
        || !amz_date.starts_with(date)
        || !signed_names.contains(&"host")
        || !signed_names.contains(&"x-amz-date")
        || (header("x-amz-security-token") != Some(SESSION_TOKEN))
        || !signed_names.contains(&"x-amz-security-token")
    {
        return false;
    }
    let canonical_headers: String = signed_names
        .iter()
        .map(|name| {
            let values: Vec<String> = headers
                .get_all(*name)
                .iter()
                .map(|v| {
                    v.to_str()
                        .unwrap_or_default()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ")
                })
                .collect();
            format!("{name}:{}\n", values.join(","))
        })
        .collect();
    let canonical_uri = uri
        .path()
        .split('/')
        .map(aws_encode)
        .collect::<Vec<_>>()
        .join("/");
    let canonical_request = format!(
        "{method}\n{canonical_uri}\n{}\n{canonical_headers}\n{signed}\n{payload_hash}",
        uri.query().unwrap_or_default()
    );
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical_request.as_bytes())
    );
    let mut key = format!("AWS4{SECRET}").into_bytes();
    for part in [*date, *region, *service, "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    hex::encode(hmac_sha256(&key, string_to_sign.as_bytes())) == given
}

fn aws_error(status: u16, error_type: &str, message: &str) -> Response {
    let mut response = (
        axum::http::StatusCode::from_u16(status).unwrap(),
        axum::Json(json!({ "message": message })),
    )
        .into_response();
    let value = format!("{error_type}:http://internal.amazon.com/coral/com.amazon.bedrock/");
    response
        .headers_mut()
        .insert("x-amzn-errortype", value.parse().unwrap());
    response
}

/// What Converse refuses before running the model: no messages, a first
/// turn that is not the user's, roles that do not alternate, blank text.
fn validation_error(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    if messages.is_empty() {
        return Some(
            "The model returned the following errors: messages: at least one message is required"
                .into(),
        );
    }
    let mut expected = "user";
    for m in messages {
        if m["role"] != expected {
            return Some("A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.".into());
        }
        expected = if expected == "user" {
            "assistant"
        } else {
            "user"
        };
        for block in m["content"].as_array().into_iter().flatten() {
            if block["text"].as_str().is_some_and(|t| t.trim().is_empty()) {
                return Some("The text field in the ContentBlock object is blank. Add text to the text field, and try again.".into());
            }
        }
    }
    None
}

async fn handle(
    State(fake): State<Arc<Fake>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let signature_ok = signature_matches(&method, &uri, &headers, &body);
    let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    fake.received.lock().unwrap().push(Received {
        path: uri.path().to_string(),
        headers: headers.clone(),
        body: value.clone(),
        signature_ok,
    });
    if !signature_ok {
        return aws_error(403, "InvalidSignatureException", SIGNATURE_MISMATCH);
    }
    let encoded = aws_encode(MODEL);
    let operation = uri
        .path()
        .strip_prefix(&format!("/model/{encoded}/"))
        .unwrap_or_default();
    if !matches!(operation, "converse" | "converse-stream" | "count-tokens") {
        return aws_error(
            404,
            "ResourceNotFoundException",
            "The requested resource could not be found.",
        );
    }
    let converse = if operation == "count-tokens" {
        &value["input"]["converse"]
    } else {
        &value
    };
    if let Some(message) = validation_error(converse) {
        return aws_error(400, "ValidationException", &message);
    }
    let reply = {
        let mut replies = fake.replies.lock().unwrap();
        let mut last = fake.last.lock().unwrap();
        if let Some(next) = replies.pop_front() {
            *last = Some(next);
        }
        last.clone().unwrap()
    };
    match reply {
        Reply::Json {
            status,
            error_type,
            body,
        } => match error_type {
            Some(t) => aws_error(status, t, body["message"].as_str().unwrap_or_default()),
            None => axum::Json(body).into_response(),
        },
        Reply::Stream(chunks) => {
            let chunks = chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from(c)));
            let mut response = Response::new(Body::from_stream(futures::stream::iter(chunks)));
            response.headers_mut().insert(
                "content-type",
                "application/vnd.amazon.eventstream".parse().unwrap(),
            );
            response
        }
    }
}

// ------------------------------------- AWS's event-stream framing, by hand

/// CRC32 (IEEE 802.3), bit by bit.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for byte in bytes {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// One event-stream message: prelude (total length, headers length, CRC),
/// string headers (type 7), payload, message CRC.
fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in headers {
        block.push(name.len() as u8);
        block.extend_from_slice(name.as_bytes());
        block.push(7);
        block.extend_from_slice(&(value.len() as u16).to_be_bytes());
        block.extend_from_slice(value.as_bytes());
    }
    let total = 12 + block.len() + payload.len() + 4;
    let mut out = Vec::new();
    out.extend_from_slice(&(total as u32).to_be_bytes());
    out.extend_from_slice(&(block.len() as u32).to_be_bytes());
    let prelude = crc32(&out);
    out.extend_from_slice(&prelude.to_be_bytes());
    out.extend_from_slice(&block);
    out.extend_from_slice(payload);
    let whole = crc32(&out);
    out.extend_from_slice(&whole.to_be_bytes());
    out
}

fn event(kind: &str, payload: Value) -> Vec<u8> {
    frame(
        &[
            (":event-type", kind),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}

fn exception(kind: &str, message: &str) -> Vec<u8> {
    frame(
        &[
            (":exception-type", kind),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        json!({ "message": message }).to_string().as_bytes(),
    )
}

fn text_stream(pieces: &[&str], stop: &str) -> Vec<Vec<u8>> {
    let mut frames = vec![event("messageStart", json!({"role": "assistant"}))];
    for piece in pieces {
        frames.push(event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": piece}}),
        ));
    }
    frames.push(event("contentBlockStop", json!({"contentBlockIndex": 0})));
    frames.push(event("messageStop", json!({"stopReason": stop})));
    frames.push(event(
        "metadata",
        json!({"usage": {"inputTokens": 12, "outputTokens": 4, "totalTokens": 16},
               "metrics": {"latencyMs": 210}}),
    ));
    frames
}

/// The frames as the wire carries them: one chunk, cut mid-message here
/// and there, so the reader must reassemble.
fn on_the_wire(frames: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let all: Vec<u8> = frames.concat();
    all.chunks(37).map(<[u8]>::to_vec).collect()
}

fn answer(content: Value, stop: &str) -> Reply {
    Reply::Json {
        status: 200,
        error_type: None,
        body: json!({
            "output": {"message": {"role": "assistant", "content": content}},
            "stopReason": stop,
            "usage": {"inputTokens": 25, "outputTokens": 7, "totalTokens": 32},
            "metrics": {"latencyMs": 420}
        }),
    }
}

fn error(status: u16, error_type: &'static str, message: &str) -> Reply {
    Reply::Json {
        status,
        error_type: Some(error_type),
        body: json!({ "message": message }),
    }
}

// ---------------------------------------------------------------- onejob

const KEY_ID_ENV: &str = "ONEJOB_TEST_BEDROCK_KEY_ID";
const SECRET_ENV: &str = "ONEJOB_TEST_BEDROCK_SECRET";
const WRONG_SECRET_ENV: &str = "ONEJOB_TEST_BEDROCK_WRONG_SECRET";
const TOKEN_ENV: &str = "ONEJOB_TEST_BEDROCK_TOKEN";

fn provider_file(base_url: &str, secret_env: &str) -> String {
    std::env::set_var(KEY_ID_ENV, ACCESS_KEY_ID);
    std::env::set_var(SECRET_ENV, SECRET);
    std::env::set_var(WRONG_SECRET_ENV, "not-the-secret-the-fake-knows");
    std::env::set_var(TOKEN_ENV, SESSION_TOKEN);
    format!(
        "kind = \"bedrock\"\nbase_url = \"{base_url}\"\nregion = \"{REGION}\"\nmodel = \"{MODEL}\"\n\
         access_key_id_env = \"{KEY_ID_ENV}\"\nsecret_access_key_env = \"{secret_env}\"\n\
         session_token_env = \"{TOKEN_ENV}\"\n\
         tokenizer = \"cl100k_base\"\ncontext_window = 200000\n\
         [timeouts]\nconnect_ms = 1000\nfirst_byte_ms = 5000\ntotal_ms = 10000\n"
    )
}

fn adapter(base_url: &str) -> Arc<dyn Provider> {
    let text = provider_file(base_url, SECRET_ENV);
    let config =
        ProviderConfig::parse(&text, std::path::Path::new("providers/bedrock.toml")).unwrap();
    build_provider("bedrock", &config).unwrap()
}

/// A onejob world whose default route is one bedrock provider on `fake`.
async fn world_on(backend: Backend, fake: &FakeBedrock, secret_env: &'static str) -> World {
    let base = fake.base_url.clone();
    start_world(backend, &[], route("bedrock", &[]), move |c| {
        std::fs::write(
            c.providers_dir.join("bedrock.toml"),
            provider_file(&base, secret_env),
        )
        .unwrap();
    })
    .await
}

async fn complete(world: &World, key: &str, body: &Value) -> (u16, Value) {
    let response = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

/// The data of each SSE event onejob streamed, `[DONE]` included.
async fn stream(world: &World, key: &str, body: &Value) -> (u16, Vec<Value>, bool) {
    let response = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    let data: Vec<&str> = text
        .split("\n\n")
        .flat_map(|block| block.lines())
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    let done = data.last() == Some(&"[DONE]");
    let events = data
        .iter()
        .filter(|d| **d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    (status, events, done)
}

fn streamed_text(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

fn ask(text: &str) -> Value {
    json!({"model": "default", "max_completion_tokens": 256, "temperature": 0.2,
           "messages": [{"role": "system", "content": "Answer briefly."},
                        {"role": "user", "content": text}]})
}

fn weather_tool() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}])
}

async fn a_plain_answer_comes_back_through_chat_completions(backend: Backend) {
    let fake = FakeBedrock::start(vec![answer(
        json!([{"text": "Tides follow the moon."}]),
        "end_turn",
    )])
    .await;
    let world = world_on(backend, &fake, SECRET_ENV).await;
    let (status, body) = complete(&world, "plain-1", &ask("Why tides?")).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["message"]["content"], "Tides follow the moon.");
    assert_eq!(choice["finish_reason"], "stop");
    assert_eq!(body["usage"]["prompt_tokens"], 25);
    assert_eq!(body["usage"]["completion_tokens"], 7);

    let received = fake.received();
    assert_eq!(received.len(), 1, "one request to Bedrock");
    let r = &received[0];
    assert!(r.signature_ok, "signed as AWS verifies");
    assert_eq!(
        r.path,
        "/model/us.anthropic.claude-3-5-sonnet-20241022-v2%3A0/converse"
    );
    assert_eq!(r.headers["x-amz-security-token"], SESSION_TOKEN);
    assert_eq!(r.body["system"], json!([{"text": "Answer briefly."}]));
    assert_eq!(
        r.body["messages"],
        json!([{"role": "user", "content": [{"text": "Why tides?"}]}])
    );
    assert_eq!(
        r.body["inferenceConfig"],
        json!({"maxTokens": 256, "temperature": 0.2})
    );
    // A replay is answered by onejob, not by another request to Bedrock.
    let (status, again) = complete(&world, "plain-1", &ask("Why tides?")).await;
    assert_eq!((status, &again["choices"]), (200, &body["choices"]));
    assert_eq!(fake.received().len(), 1);
    world.stop().await;
}

async fn a_streamed_answer_arrives_in_pieces_through_chat_completions(backend: Backend) {
    let fake = FakeBedrock::start(vec![Reply::Stream(on_the_wire(text_stream(
        &["Tides ", "follow ", "the moon."],
        "end_turn",
    )))])
    .await;
    let world = world_on(backend, &fake, SECRET_ENV).await;
    let mut body = ask("Why tides?");
    body["stream"] = json!(true);
    let (status, events, done) = stream(&world, "stream-1", &body).await;
    assert_eq!(status, 200);
    assert_eq!(streamed_text(&events), "Tides follow the moon.");
    assert!(events
        .iter()
        .any(|e| e["choices"][0]["finish_reason"] == "stop"));
    assert!(done, "ends with [DONE]");
    let received = fake.received();
    assert_eq!(received.len(), 1);
    assert!(received[0].signature_ok);
    assert!(
        received[0].path.ends_with("/converse-stream"),
        "{}",
        received[0].path
    );
    world.stop().await;
}

async fn tool_calls_come_back_whole_and_streamed(backend: Backend) {
    let call = json!([{"text": "Let me check."},
        {"toolUse": {"toolUseId": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", "name": "get_weather",
                     "input": {"city": "Paris"}}}]);
    let streamed = vec![
        event("messageStart", json!({"role": "assistant"})),
        event(
            "contentBlockStart",
            json!({"contentBlockIndex": 0, "start": {"toolUse":
                {"toolUseId": "tooluse_s1", "name": "get_weather"}}}),
        ),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": "{\"city\":"}}}),
        ),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": "\"Oslo\"}"}}}),
        ),
        event("contentBlockStop", json!({"contentBlockIndex": 0})),
        event("messageStop", json!({"stopReason": "tool_use"})),
        event(
            "metadata",
            json!({"usage": {"inputTokens": 40, "outputTokens": 9, "totalTokens": 49}}),
        ),
    ];
    let fake = FakeBedrock::start(vec![
        answer(call, "tool_use"),
        Reply::Stream(on_the_wire(streamed)),
        answer(json!([{"text": "It is 18 degrees in Paris."}]), "end_turn"),
    ])
    .await;
    let world = world_on(backend, &fake, SECRET_ENV).await;
    let mut asked = ask("Weather in Paris?");
    asked["tools"] = weather_tool();
    asked["tool_choice"] = json!("required");
    let (status, body) = complete(&world, "tool-1", &asked).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    let tool_call = &choice["message"]["tool_calls"][0];
    assert_eq!(tool_call["id"], "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q");
    assert_eq!(tool_call["function"]["name"], "get_weather");
    assert_eq!(tool_call["function"]["arguments"], "{\"city\":\"Paris\"}");
    let sent = &fake.received()[0].body;
    assert_eq!(
        sent["toolConfig"],
        json!({"tools": [{"toolSpec": {"name": "get_weather", "description": "Weather in a city",
            "inputSchema": {"json": weather_tool()[0]["function"]["parameters"]}}}],
            "toolChoice": {"any": {}}})
    );

    let mut streamed_ask = ask("Weather in Oslo?");
    streamed_ask["tools"] = weather_tool();
    streamed_ask["stream"] = json!(true);
    let (status, events, done) = stream(&world, "tool-2", &streamed_ask).await;
    assert_eq!(status, 200);
    assert!(done);
    let arguments: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(arguments, "{\"city\":\"Oslo\"}");
    assert!(events
        .iter()
        .any(|e| e["choices"][0]["finish_reason"] == "tool_calls"));

    // The tool's result goes back as a toolResult block of a user turn.
    let mut answered = ask("Weather in Paris?");
    answered["tools"] = weather_tool();
    answered["messages"]
        .as_array_mut()
        .unwrap()
        .extend([choice["message"].clone(),
            json!({"role": "tool", "tool_call_id": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", "content": "{\"temp_c\": 18}"})]);
    let (status, body) = complete(&world, "tool-3", &answered).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["choices"][0]["message"]["content"],
        "It is 18 degrees in Paris."
    );
    let received = fake.received();
    assert_eq!(received.len(), 3);
    assert!(received.iter().all(|r| r.signature_ok));
    let turns = received[2].body["messages"].as_array().unwrap().clone();
    assert_eq!(
        turns[1],
        json!({"role": "assistant", "content": [{"text": "Let me check."},
            {"toolUse": {"toolUseId": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q", "name": "get_weather",
                         "input": {"city": "Paris"}}}]})
    );
    assert_eq!(
        turns[2],
        json!({"role": "user", "content": [{"toolResult": {"toolUseId": "tooluse_kZJMlvQmRJ6eAyJE5GIl7Q",
            "content": [{"json": {"temp_c": 18}}]}}]})
    );
    world.stop().await;
}

async fn a_json_schema_answer_is_the_forced_tools_input(backend: Backend) {
    let streamed = vec![
        event("messageStart", json!({"role": "assistant"})),
        event(
            "contentBlockStart",
            json!({"contentBlockIndex": 0, "start": {"toolUse":
                {"toolUseId": "tooluse_js", "name": "verdict"}}}),
        ),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": "{\"label\": \"ham\","}}}),
        ),
        event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"toolUse": {"input": " \"score\": 0.2}"}}}),
        ),
        event("contentBlockStop", json!({"contentBlockIndex": 0})),
        event("messageStop", json!({"stopReason": "tool_use"})),
        event(
            "metadata",
            json!({"usage": {"inputTokens": 30, "outputTokens": 11, "totalTokens": 41}}),
        ),
    ];
    let fake = FakeBedrock::start(vec![
        answer(
            json!([{"toolUse": {"toolUseId": "tooluse_j", "name": "verdict",
                                "input": {"label": "spam", "score": 0.9}}}]),
            "tool_use",
        ),
        Reply::Stream(on_the_wire(streamed)),
    ])
    .await;
    let world = world_on(backend, &fake, SECRET_ENV).await;
    let schema = json!({"type": "object", "properties": {"label": {"type": "string"},
        "score": {"type": "number"}}, "required": ["label", "score"], "additionalProperties": false});
    let mut asked = ask("Classify: WIN A PRIZE");
    asked["response_format"] =
        json!({"type": "json_schema", "json_schema": {"name": "verdict", "schema": schema}});
    let (status, body) = complete(&world, "schema-1", &asked).await;
    assert_eq!(status, 200, "{body}");
    let choice = &body["choices"][0];
    assert_eq!(choice["finish_reason"], "stop");
    let content: Value =
        serde_json::from_str(choice["message"]["content"].as_str().unwrap()).unwrap();
    assert_eq!(content, json!({"label": "spam", "score": 0.9}));
    assert!(choice["message"]
        .get("tool_calls")
        .is_none_or(Value::is_null));
    let sent = &fake.received()[0].body;
    assert_eq!(
        sent["toolConfig"]["toolChoice"],
        json!({"tool": {"name": "verdict"}})
    );
    assert_eq!(
        sent["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"],
        schema
    );

    // Streamed, the forced tool's input arrives as the answer's text.
    asked["messages"][1]["content"] = json!("Classify: lunch at noon?");
    asked["stream"] = json!(true);
    let (status, events, done) = stream(&world, "schema-2", &asked).await;
    assert_eq!(status, 200);
    assert!(done, "{events:?}");
    let text: Value = serde_json::from_str(&streamed_text(&events)).unwrap();
    assert_eq!(text, json!({"label": "ham", "score": 0.2}));
    assert!(events
        .iter()
        .all(|e| e["choices"][0]["delta"].get("tool_calls").is_none()));
    assert_eq!(fake.received().len(), 2);
    world.stop().await;
}

async fn throttling_and_503_are_retried_and_then_answered(backend: Backend) {
    for (error_type, status) in [
        ("ThrottlingException", 429),
        ("ServiceUnavailableException", 503),
    ] {
        let fake = FakeBedrock::start(vec![
            error(
                status,
                error_type,
                "Too many requests, please wait before trying again.",
            ),
            answer(json!([{"text": "second time lucky"}]), "end_turn"),
        ])
        .await;
        let world = world_on(backend, &fake, SECRET_ENV).await;
        let (got, body) = complete(&world, "retried", &ask("hello")).await;
        assert_eq!(got, 200, "{error_type}: {body}");
        assert_eq!(
            body["choices"][0]["message"]["content"],
            "second time lucky"
        );
        assert_eq!(fake.received().len(), 2, "{error_type}: retried once");
        world.stop().await;
    }
}

async fn a_validation_error_is_definitive_and_input_too_long_is_context_length(backend: Backend) {
    let invalid = "The provided model identifier is invalid.";
    for (reply, code) in [
        (error(400, "ValidationException", invalid), "bad_request"),
        (
            error(
                400,
                "ValidationException",
                "Input is too long for requested model.",
            ),
            "context_length_exceeded",
        ),
        (
            answer(
                json!([{"text": "Sorry, I can't help with that."}]),
                "content_filtered",
            ),
            "content_policy_violation",
        ),
    ] {
        let fake = FakeBedrock::start(vec![reply]).await;
        let world = world_on(backend, &fake, SECRET_ENV).await;
        let (status, body) = complete(&world, "refused", &ask("hello")).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (400, Some(code)),
            "{body}"
        );
        if code == "bad_request" {
            let message = body["error"]["message"].as_str().unwrap();
            assert!(
                message.contains(&format!("ValidationException: {invalid}")),
                "{body}"
            );
        }
        assert_eq!(fake.received().len(), 1, "{code}: never retried");
        world.stop().await;
    }
}

async fn an_exception_frame_or_a_bad_crc_is_a_cut_stream(backend: Backend) {
    let mut cut = text_stream(&["Tides ", "follow "], "end_turn");
    cut.truncate(3);
    cut.push(exception(
        "modelStreamErrorException",
        "The model stream encountered an error.",
    ));
    let mut corrupt = text_stream(&["Tides ", "follow ", "the moon."], "end_turn");
    let n = corrupt[2].len();
    corrupt[2][n - 6] ^= 0x20; // a payload byte: its message CRC no longer holds
    for (name, frames) in [("exception frame", cut), ("bad CRC", corrupt)] {
        let fake = FakeBedrock::start(vec![Reply::Stream(on_the_wire(frames))]).await;
        let world = world_on(backend, &fake, SECRET_ENV).await;
        let mut body = ask("Why tides?");
        body["stream"] = json!(true);
        let (status, events, done) = stream(&world, "cut", &body).await;
        assert_eq!(status, 200, "{name}");
        assert!(
            streamed_text(&events).starts_with("Tides "),
            "{name}: {events:?}"
        );
        let error = events
            .iter()
            .find_map(|e| e.get("error"))
            .unwrap_or_else(|| panic!("{name}: an in-band error: {events:?}"));
        assert_eq!(error["code"], "stream_cut", "{name}: {error}");
        assert!(!done, "{name}: a cut stream never ends with [DONE]");
        assert!(
            !events
                .iter()
                .any(|e| e["choices"][0]["finish_reason"] == "stop"),
            "{name}: never a finish on a truncated answer"
        );
        // Bedrock honours no idempotency key: nothing is re-sent to it
        // while the cut attempt's outcome is unknown.
        assert_eq!(fake.received().len(), 1, "{name}");
        world.stop().await;
    }
}

async fn a_request_signed_with_the_wrong_secret_is_refused_once(backend: Backend) {
    let fake = FakeBedrock::start(vec![answer(json!([{"text": "never"}]), "end_turn")]).await;
    let world = world_on(backend, &fake, WRONG_SECRET_ENV).await;
    let (status, body) = complete(&world, "forged", &ask("hello")).await;
    assert_eq!(
        (status, body["error"]["code"].as_str()),
        (502, Some("unauthorized")),
        "{body}"
    );
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("InvalidSignatureException"), "{body}");
    assert!(!body.to_string().contains("not-the-secret"), "{body}");
    let received = fake.received();
    assert_eq!(received.len(), 1, "a definitive refusal: not retried");
    assert!(!received[0].signature_ok);
    world.stop().await;
}

// ------------------------------------------------ the adapter, call by call

fn request() -> ChatRequest {
    ChatRequest {
        system: Some("Answer in JSON.".into()),
        messages: vec![
            Message::new(Role::User, "first"),
            Message::new(Role::Assistant, "ok"),
            Message::new(Role::User, "third"),
        ],
        temperature: Some(0.0),
        max_tokens: Some(64),
        top_p: None,
        response_schema: None,
        idempotency_key: "onejob-test-key".into(),
        options: onejob::providers::ChatOptions::default(),
    }
}

fn failed(outcome: &AttemptOutcome) -> (bool, String, String) {
    match outcome {
        AttemptOutcome::Failed(f) => (f.retryable, f.kind.to_string(), f.message.clone()),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn every_error_class_is_classified_where_it_is_born() {
    let rows: Vec<(Reply, bool, &str)> = vec![
        (
            error(
                429,
                "ThrottlingException",
                "Too many requests, please wait before trying again.",
            ),
            true,
            "rate_limited",
        ),
        (
            error(
                400,
                "ValidationException",
                "Malformed input request: #: required key [messages] not found",
            ),
            false,
            "bad_request",
        ),
        (
            error(
                400,
                "ValidationException",
                "Input is too long for requested model.",
            ),
            false,
            "context_length_exceeded",
        ),
        (
            error(
                400,
                "ValidationException",
                "prompt is too long: 210000 tokens > 200000 maximum",
            ),
            false,
            "context_length_exceeded",
        ),
        (
            error(
                503,
                "ServiceUnavailableException",
                "Bedrock is unable to process your request.",
            ),
            true,
            "unavailable",
        ),
        (
            error(
                500,
                "InternalServerException",
                "The server encountered an error processing your request.",
            ),
            true,
            "server_error",
        ),
        (
            error(
                403,
                "AccessDeniedException",
                "You don't have access to the model with the specified model ID.",
            ),
            false,
            "forbidden",
        ),
        (
            error(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            ),
            false,
            "unauthorized",
        ),
        (
            error(
                408,
                "ModelTimeoutException",
                "Model has timed out in processing the request.",
            ),
            true,
            "request_timeout",
        ),
        (
            error(
                404,
                "ResourceNotFoundException",
                "Could not resolve the foundation model.",
            ),
            false,
            "not_found",
        ),
    ];
    for (reply, retryable, kind) in rows {
        let fake = FakeBedrock::start(vec![reply]).await;
        let outcome = adapter(&fake.base_url).call(&request()).await;
        let (r, k, message) = failed(&outcome);
        assert_eq!((r, k.as_str()), (retryable, kind), "{message}");
        assert!(!format!("{outcome:?}").contains(SECRET));
        assert_eq!(fake.received().len(), 1);
    }
    // Guardrails and content filters stop the answer: a definitive refusal.
    for stop in ["guardrail_intervened", "content_filtered"] {
        let fake = FakeBedrock::start(vec![answer(json!([{"text": "Sorry."}]), stop)]).await;
        let outcome = adapter(&fake.base_url).call(&request()).await;
        let (retryable, kind, message) = failed(&outcome);
        assert!(
            !retryable && kind == "content_policy" && message.contains(stop),
            "{message}"
        );
    }
    // max_tokens is an answer that stopped for length.
    let fake = FakeBedrock::start(vec![answer(json!([{"text": "Tides are"}]), "max_tokens")]).await;
    let outcome = adapter(&fake.base_url).call(&request()).await;
    assert!(
        matches!(&outcome, AttemptOutcome::Succeeded(s) if s.output == "Tides are"),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn a_conversation_converse_cannot_express_is_never_sent() {
    let fake = FakeBedrock::start(vec![answer(json!([{"text": "x"}]), "end_turn")]).await;
    let provider = adapter(&fake.base_url);
    let mut starts_with_assistant = request();
    starts_with_assistant.messages.remove(0);
    let mut seeded = request();
    seeded.options.seed = Some(7);
    for req in [starts_with_assistant, seeded] {
        let outcome = provider.call(&req).await;
        let (retryable, kind, _) = failed(&outcome);
        assert!(!retryable && kind == "invalid_prompt");
    }
    assert!(fake.received().is_empty());
    assert!(matches!(provider.lookup("k").await, Lookup::CannotTell(m) if m.contains("no lookup")));
}

#[tokio::test]
async fn count_tokens_sends_the_converse_input_and_reads_input_tokens() {
    let fake = FakeBedrock::start(vec![Reply::Json {
        status: 200,
        error_type: None,
        body: json!({"inputTokens": 31}),
    }])
    .await;
    let provider = adapter(&fake.base_url);
    assert_eq!(provider.count_tokens(&request()).await, Some(Ok(31)));
    let r = &fake.received()[0];
    assert!(r.signature_ok);
    assert!(r.path.ends_with("%3A0/count-tokens"), "{}", r.path);
    let converse = &r.body["input"]["converse"];
    assert_eq!(converse["system"], json!([{"text": "Answer in JSON."}]));
    assert_eq!(converse["messages"].as_array().unwrap().len(), 3);
    assert!(converse.get("inferenceConfig").is_none());
}

#[tokio::test]
async fn a_stream_closed_before_message_stop_is_unknown() {
    let mut frames = text_stream(&["Tides "], "end_turn");
    frames.truncate(2);
    let fake = FakeBedrock::start(vec![Reply::Stream(on_the_wire(frames))]).await;
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let (outcome, finish) = adapter(&fake.base_url).stream(&request(), &tx).await;
    assert!(finish.is_none());
    assert!(
        matches!(&outcome, AttemptOutcome::Unknown(a) if a.kind == "stream_incomplete"),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn the_simulators_bedrock_wire_streams_the_answer_it_gives_whole() {
    let sim = onejob::sim::SimServer::start("127.0.0.1:0").await.unwrap();
    let text = provider_file(&sim.base_url(), SECRET_ENV).replace(MODEL, "healthy");
    let config =
        ProviderConfig::parse(&text, std::path::Path::new("providers/sim-bedrock.toml")).unwrap();
    let provider = build_provider("sim-bedrock", &config).unwrap();
    let mut whole_request = request();
    whole_request.idempotency_key = "sim-whole".into();
    let AttemptOutcome::Succeeded(whole) = provider.call(&whole_request).await else {
        panic!("the simulator answers")
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut streamed_request = request();
    streamed_request.idempotency_key = "sim-streamed".into();
    let (outcome, finish) = provider.stream(&streamed_request, &tx).await;
    drop(tx);
    let mut pieces = Vec::new();
    while let Some(heard) = rx.recv().await {
        if let Some(delta) = heard.piece() {
            pieces.push(delta.content);
        }
    }
    let AttemptOutcome::Succeeded(streamed) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(
        streamed.output, whole.output,
        "the same prompt, the same answer"
    );
    assert!(pieces.len() > 1, "in pieces: {pieces:?}");
    assert_eq!(pieces.concat(), whole.output);
    assert_eq!(finish.unwrap().finish_reason.name(), "stop");
    assert_eq!(streamed.usage, whole.usage);
    assert_eq!(sim.ledger().executions("sim-streamed"), 1);
}

#[tokio::test]
async fn an_exception_before_the_answer_began_is_the_error_it_names() {
    for (frames, expected) in [
        (
            vec![exception(
                "throttlingException",
                "Too many tokens, please wait before trying again.",
            )],
            Some((true, "rate_limited")),
        ),
        (
            vec![exception(
                "validationException",
                "Input is too long for requested model.",
            )],
            Some((false, "context_length_exceeded")),
        ),
        // The model had started: whatever the exception, the outcome is unknown.
        (
            vec![
                event("messageStart", json!({"role": "assistant"})),
                exception("throttlingException", "Too many tokens."),
            ],
            None,
        ),
        (
            vec![exception(
                "modelStreamErrorException",
                "The model stream encountered an error.",
            )],
            None,
        ),
    ] {
        let fake = FakeBedrock::start(vec![Reply::Stream(on_the_wire(frames))]).await;
        let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
        let (outcome, finish) = adapter(&fake.base_url).stream(&request(), &tx).await;
        assert!(finish.is_none());
        match (expected, &outcome) {
            (Some((retryable, kind)), AttemptOutcome::Failed(f)) => {
                assert_eq!((f.retryable, f.kind.as_str()), (retryable, kind), "{f:?}")
            }
            (None, AttemptOutcome::Unknown(a)) => assert_eq!(a.kind, "stream_cut", "{a:?}"),
            _ => panic!("expected {expected:?}, got {outcome:?}"),
        }
    }
}

#[tokio::test]
async fn a_max_tokens_stop_is_a_length_finish_whole_and_streamed() {
    let fake = FakeBedrock::start(vec![
        answer(json!([{"text": "Tides "}]), "max_tokens"),
        Reply::Stream(on_the_wire(text_stream(&["Tides "], "max_tokens"))),
    ])
    .await;
    let provider = adapter(&fake.base_url);
    let AttemptOutcome::Succeeded(whole) = provider.call(&request()).await else {
        panic!("an answer")
    };
    assert_eq!(whole.finish, Some(FinishReason::Length));
    let (tx, _rx) = tokio::sync::mpsc::unbounded_channel();
    let (outcome, finish) = provider.stream(&request(), &tx).await;
    let AttemptOutcome::Succeeded(streamed) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(streamed.finish, Some(FinishReason::Length));
    assert_eq!(finish.unwrap().finish_reason, FinishReason::Length);
}

//! Fake upstreams for the provider suites: an axum server on port 0 answering
//! in a provider's published wire format, and raw sockets for the faults an
//! HTTP framework will not produce (a body cut off, a close after the request).
#![allow(dead_code)]

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use onejob::providers::config::ProviderConfig;
use onejob::providers::{build_provider, AttemptOutcome, ChatRequest, Provider};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

pub const KEY_ENV: &str = "ONEJOB_TEST_PROVIDER_KEY";
pub const KEY_VALUE: &str = "sk-test-never-printed";

/// How the fake upstream answers every request.
#[derive(Debug, Clone)]
pub enum Reply {
    Status {
        status: u16,
        headers: Vec<(&'static str, &'static str)>,
        body: String,
    },
    /// Read the request, never send headers.
    Hang,
    /// Send headers declaring `declared` bytes, send `body`, close.
    CutBody { declared: usize, body: String },
    /// Send headers and part of the body, then stay silent.
    StallBody { body: String },
    /// Read the whole request, then close without a byte.
    CloseAfterRequest,
    /// Nothing listens on the port.
    Refused,
}

pub fn json(status: u16, body: &str) -> Reply {
    Reply::Status {
        status,
        headers: vec![],
        body: body.to_string(),
    }
}

pub fn json_with(status: u16, headers: Vec<(&'static str, &'static str)>, body: &str) -> Reply {
    Reply::Status {
        status,
        headers,
        body: body.to_string(),
    }
}

/// A request as the upstream saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Value,
}

pub struct Upstream {
    pub base_url: String,
    pub seen: Arc<Mutex<Vec<Seen>>>,
}

impl Upstream {
    pub fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

#[derive(Clone)]
struct FakeState {
    reply: Reply,
    seen: Arc<Mutex<Vec<Seen>>>,
}

async fn fake(
    State(s): State<FakeState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let body = serde_json::from_slice(&body).unwrap_or(Value::Null);
    s.seen.lock().unwrap().push(Seen {
        method,
        uri,
        headers,
        body,
    });
    match s.reply {
        Reply::Status {
            status,
            headers,
            body,
        } => {
            let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
            response
                .headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            for (name, value) in headers {
                response.headers_mut().insert(name, value.parse().unwrap());
            }
            response
        }
        _ => std::future::pending().await,
    }
}

/// Read one HTTP/1.1 request (headers and Content-Length body) off `socket`.
async fn read_request(socket: &mut tokio::net::TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = socket.read(&mut chunk).await.unwrap_or(0);
        if n == 0 {
            return;
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf).to_string();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                return;
            }
        }
    }
}

async fn raw(reply: Reply) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let reply = reply.clone();
            tokio::spawn(async move {
                read_request(&mut socket).await;
                match reply {
                    Reply::CutBody { declared, body } => {
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {declared}\r\n\r\n");
                        socket.write_all(head.as_bytes()).await.unwrap();
                        socket.write_all(body.as_bytes()).await.unwrap();
                        socket.flush().await.unwrap();
                    }
                    Reply::StallBody { body } => {
                        let head = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n", body.len() * 2);
                        socket.write_all(head.as_bytes()).await.unwrap();
                        socket.write_all(body.as_bytes()).await.unwrap();
                        socket.flush().await.unwrap();
                        std::future::pending::<()>().await;
                    }
                    _ => {}
                }
                drop(socket);
            });
        }
    });
    format!("http://{addr}")
}

/// Start an upstream answering every request with `reply`.
pub async fn upstream(reply: Reply) -> Upstream {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let base_url = match reply {
        Reply::CutBody { .. } | Reply::StallBody { .. } | Reply::CloseAfterRequest => {
            raw(reply).await
        }
        Reply::Refused => {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            let addr: SocketAddr = listener.local_addr().unwrap();
            drop(listener);
            format!("http://{addr}")
        }
        Reply::Status { .. } | Reply::Hang => {
            let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let app = axum::Router::new().fallback(fake).with_state(FakeState {
                reply,
                seen: seen.clone(),
            });
            tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
            format!("http://{addr}")
        }
    };
    Upstream { base_url, seen }
}

/// A provider config of `kind` pointing at `base_url`, with short timeouts
/// so the timeout rows finish quickly.
pub fn config(kind: &str, base_url: &str, extra: &str) -> ProviderConfig {
    std::env::set_var(KEY_ENV, KEY_VALUE);
    let text = format!(
        "kind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"test-model\"\napi_key_env = \"{KEY_ENV}\"\n\
         tokenizer = \"o200k_base\"\ncontext_window = 8192\n{extra}\n\
         [timeouts]\nconnect_ms = 300\nfirst_byte_ms = 400\ntotal_ms = 800\n"
    );
    ProviderConfig::parse(&text, Path::new("providers/test.toml")).unwrap()
}

pub fn provider(kind: &str, base_url: &str) -> Arc<dyn Provider> {
    build_provider("test", &config(kind, base_url, "")).unwrap()
}

pub fn request() -> ChatRequest {
    use onejob::domain::request::{Message, Role};
    ChatRequest {
        system: Some("Answer in JSON.".into()),
        messages: vec![
            Message::new(Role::User, "first"),
            Message::new(Role::User, "second"),
            Message::new(Role::Assistant, "ok"),
            Message::new(Role::User, "third"),
        ],
        temperature: Some(0.0),
        max_tokens: Some(64),
        top_p: None,
        response_schema: Some(
            serde_json::json!({"type":"object","properties":{"a":{"type":"string"}},
            "required":["a"],"additionalProperties":false}),
        ),
        idempotency_key: "onejob-test-key".into(),
        options: onejob::providers::ChatOptions::default(),
    }
}

/// What a row expects of the call.
#[derive(Debug, Clone)]
pub enum Expect {
    Succeeded {
        output: &'static str,
    },
    Failed {
        retryable: bool,
        kind: &'static str,
        retry_after: Option<Duration>,
    },
    Unknown {
        kind: &'static str,
    },
}

pub struct Row {
    pub name: &'static str,
    pub reply: Reply,
    pub expect: Expect,
}

/// The shared suite: every row against a fresh upstream; all failures are
/// collected so one run shows every misclassified row.
pub async fn run_rows(kind: &str, rows: Vec<Row>) {
    run_rows_with(kind, "", rows).await
}

/// [`run_rows`] for a kind whose file needs more fields (`extra`, TOML lines).
pub async fn run_rows_with(kind: &str, extra: &str, rows: Vec<Row>) {
    let mut wrong = Vec::new();
    for row in rows {
        let up = upstream(row.reply.clone()).await;
        let config = config(kind, &up.base_url, extra);
        let outcome = build_provider("test", &config)
            .unwrap()
            .call(&request())
            .await;
        let ok = match (&row.expect, &outcome) {
            (Expect::Succeeded { output }, AttemptOutcome::Succeeded(s)) => s.output == *output,
            (
                Expect::Failed {
                    retryable,
                    kind,
                    retry_after,
                },
                AttemptOutcome::Failed(f),
            ) => {
                f.retryable == *retryable
                    && f.kind == *kind
                    && (retry_after.is_none() || f.retry_after == *retry_after)
            }
            (Expect::Unknown { kind }, AttemptOutcome::Unknown(a)) => a.kind == *kind,
            _ => false,
        };
        assert!(
            !format!("{outcome:?}").contains(KEY_VALUE),
            "{}: key leaked",
            row.name
        );
        if !ok {
            wrong.push(format!(
                "{}: expected {:?}, got {outcome:?}",
                row.name, row.expect
            ));
        }
    }
    assert!(wrong.is_empty(), "misclassified:\n{}", wrong.join("\n"));
}

/// Rows every wire format shares: transport faults, which know no body format.
pub fn transport_rows() -> Vec<Row> {
    vec![
        Row {
            name: "slow headers beyond first_byte timeout",
            reply: Reply::Hang,
            expect: Expect::Unknown { kind: "timeout" },
        },
        Row {
            name: "body cut half-way",
            reply: Reply::CutBody {
                declared: 500,
                body: "{\"id\":\"x\",\"choi".into(),
            },
            expect: Expect::Unknown {
                kind: "truncated_body",
            },
        },
        Row {
            name: "body stalls beyond total timeout",
            reply: Reply::StallBody {
                body: "{\"id\":".into(),
            },
            expect: Expect::Unknown { kind: "timeout" },
        },
        Row {
            name: "connection closed after the request",
            reply: Reply::CloseAfterRequest,
            expect: Expect::Unknown {
                kind: "connection_reset",
            },
        },
        Row {
            name: "connect refused",
            reply: Reply::Refused,
            expect: Expect::Failed {
                retryable: true,
                kind: "connect_failed",
                retry_after: None,
            },
        },
        Row {
            name: "502 from a gateway",
            reply: json(502, "<html>bad gateway</html>"),
            expect: Expect::Unknown {
                kind: "gateway_error",
            },
        },
        Row {
            name: "504 from a gateway",
            reply: json(504, ""),
            expect: Expect::Unknown {
                kind: "gateway_error",
            },
        },
        Row {
            name: "invalid JSON in a 200",
            reply: json(200, "{\"id\": \"x\", "),
            expect: Expect::Unknown {
                kind: "invalid_body",
            },
        },
        Row {
            name: "500",
            reply: json(500, ""),
            expect: Expect::Failed {
                retryable: true,
                kind: "server_error",
                retry_after: None,
            },
        },
        Row {
            name: "503 with Retry-After",
            reply: json_with(503, vec![("retry-after", "3")], ""),
            expect: Expect::Failed {
                retryable: true,
                kind: "unavailable",
                retry_after: Some(Duration::from_secs(3)),
            },
        },
    ]
}

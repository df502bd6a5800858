//! Fuzz targets over the request parsers, as property tests (`cargo fuzz`
//! needs a nightly toolchain): the job body, the completion body, the
//! headers, provider files and contract folders. Every input must get a
//! clear answer (an error with a stable code, or a parse error naming the
//! file), never a panic or a 5xx, and the server keeps answering.
//!
//! `ONEJOB_FUZZ_CASES` sets the cases per target (default 32, so `cargo
//! test` stays quick); `.ci/run` raises it for a bounded run on every CI run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{spawn_app, Backend};
use onejob::domain::request::IdempotencyKey;
use onejob::domain::JobRequest;
use onejob::providers::config::ProviderConfig;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use serde_json::{json, Map, Value};
use std::path::Path;

fn cases() -> u32 {
    std::env::var("ONEJOB_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32)
}

fn runner() -> TestRunner {
    TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    })
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        ".{0,24}".prop_map(Value::String),
        Just(json!("user")),
        Just(json!("system")),
        Just(json!(256)),
        Just(json!(-1)),
        Just(json!(1e300)),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("role".to_string()),
                    Just("content".to_string()),
                    Just("temperature".to_string()),
                    Just("max_tokens".to_string()),
                    Just("type".to_string()),
                    Just("text".to_string()),
                    "[a-z_]{1,8}",
                ],
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Bodies shaped like a job request, with every field possibly wrong.
fn job_like() -> impl Strategy<Value = Value> {
    let field = |name: &'static str| prop::option::of(json_value()).prop_map(move |v| (name, v));
    (
        field("messages"),
        field("params"),
        field("route"),
        field("contract"),
        field("input"),
        prop::option::of(("[a-z]{1,6}", json_value())),
    )
        .prop_map(|(a, b, c, d, e, extra)| {
            let mut map = Map::new();
            for (name, v) in [a, b, c, d, e] {
                if let Some(v) = v {
                    map.insert(name.to_string(), v);
                }
            }
            if let Some((k, v)) = extra {
                map.insert(k, v);
            }
            Value::Object(map)
        })
}

/// Bytes: random, JSON-shaped, deeply nested, or JSON with invalid UTF-8.
fn body_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..256),
        job_like().prop_map(|v| v.to_string().into_bytes()),
        (1usize..5_000).prop_map(|depth| {
            let mut s = "[".repeat(depth);
            s.push_str(&"]".repeat(depth));
            s.into_bytes()
        }),
        (1usize..5_000).prop_map(|depth| {
            let mut s = "{\"messages\":".to_string();
            s.push_str(&"{\"a\":".repeat(depth));
            s.push('1');
            s.push_str(&"}".repeat(depth + 1));
            s.into_bytes()
        }),
        job_like().prop_map(|v| {
            let mut b = v.to_string().into_bytes();
            let at = b.len() / 2;
            b.splice(at..at, [0xff, 0xfe, 0xc0]);
            b
        }),
    ]
}

#[test]
fn the_job_body_parser_answers_every_input() {
    runner()
        .run(&body_bytes(), |body| {
            // Ok or a clear error; the test fails on a panic or a stack overflow.
            let _ = JobRequest::parse(&body);
            Ok(())
        })
        .unwrap();
}

#[test]
fn the_idempotency_key_parser_accepts_only_printable_ascii() {
    runner()
        .run(&prop::collection::vec(any::<u8>(), 0..300), |raw| {
            let parsed = IdempotencyKey::parse(&raw);
            let printable =
                !raw.is_empty() && raw.len() <= 255 && raw.iter().all(|b| (0x20..0x7f).contains(b));
            if parsed.is_ok() {
                prop_assert!(printable, "accepted {raw:?}");
            }
            Ok(())
        })
        .unwrap();
}

const PROVIDER: &str = "kind = \"openai\"\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\n\
api_key_env = \"K\"\ntokenizer = \"o200k_base\"\ncontext_window = 8192\n";

/// A provider file with one line replaced or added, holding a secret-like value.
fn provider_text() -> impl Strategy<Value = (String, String)> {
    let secret = "[A-Za-z0-9]{16,24}".prop_map(|s| format!("sk-{s}"));
    let keys = prop_oneof![
        Just("kind"),
        Just("base_url"),
        Just("model"),
        Just("api_key_env"),
        Just("api_key"),
        Just("tokenizer"),
        Just("context_window"),
        Just("lookup"),
        Just("timeouts"),
        Just("token"),
    ];
    let shape = 0usize..6;
    (secret, keys, shape, 0usize..7).prop_map(|(secret, key, shape, line)| {
        let value = match shape {
            0 => format!("{key} = \"{secret}\""),
            1 => format!("{key} = {secret}"),
            2 => format!("{key} = [\"{secret}\"]"),
            3 => format!("{key} = {{ x = \"{secret}\" }}"),
            4 => format!("{secret} = 1"),
            _ => format!("{key} = \"{secret}"),
        };
        let mut lines: Vec<String> = PROVIDER.lines().map(String::from).collect();
        if line < lines.len() {
            lines[line] = value;
        } else {
            lines.push(value);
        }
        (lines.join("\n"), secret)
    })
}

#[test]
fn provider_files_never_print_a_value_back() {
    runner()
        .run(&provider_text(), |(text, secret)| {
            if let Err(e) = ProviderConfig::parse(&text, Path::new("providers/fuzz.toml")) {
                let message = e.to_string();
                prop_assert!(message.contains("providers/fuzz.toml"), "{message}");
                prop_assert!(!message.contains(&secret), "leaks {secret}: {message}");
            }
            Ok(())
        })
        .unwrap();
}

#[test]
fn config_and_contract_files_answer_every_input() {
    let text = prop_oneof![
        ".{0,200}",
        job_like().prop_map(|v| format!("[server]\nlisten = {v}\n")),
        json_value()
            .prop_map(|v| format!("name = \"c\"\nprompt = {v}\n[limits.default]\nburst = {v}\n")),
    ];
    runner()
        .run(&(text, json_value()), |(toml_text, schema)| {
            let _ = onejob::config::Config::parse_file(Path::new("fuzz.toml"), &toml_text);
            let dir = tempfile::tempdir().unwrap();
            let contract = dir.path().join("c");
            std::fs::create_dir(&contract).unwrap();
            std::fs::write(contract.join("contract.toml"), &toml_text).unwrap();
            std::fs::write(contract.join("schema.json"), schema.to_string()).unwrap();
            let _ = onejob::contracts::load_all(dir.path());
            Ok(())
        })
        .unwrap();
}

/// A header value: printable, or arbitrary bytes (dropped when HTTP cannot carry them).
fn header_value() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[ -~]{0,40}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..40),
        Just(b"wait=999999999999999999999".to_vec()),
        Just(b"Bearer ".to_vec()),
    ]
}

#[test]
fn the_http_parsers_answer_every_input_with_a_code_and_the_server_stays_up() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let app = rt.block_on(spawn_app(Backend::Sqlite));
    let strategy = (
        prop_oneof![Just("/v1/jobs"), Just("/v1/chat/completions")],
        body_bytes(),
        prop::option::of(header_value()),
        prop::option::of(header_value()),
        prop::option::of(header_value()),
        any::<bool>(),
    );
    runner()
        .run(
            &strategy,
            |(path, body, idem, prefer, ctype, authorised)| {
                rt.block_on(async {
                    let mut request = app
                        .client
                        .post(format!("{}{path}", app.address))
                        .body(body.clone());
                    if authorised {
                        request = request.bearer_auth(&app.key);
                    }
                    for (name, value) in [
                        ("idempotency-key", idem),
                        ("prefer", prefer),
                        ("content-type", ctype),
                    ] {
                        if let Some(v) =
                            value.and_then(|v| reqwest::header::HeaderValue::from_bytes(&v).ok())
                        {
                            request = request.header(name, v);
                        }
                    }
                    let response = request.send().await.unwrap();
                    let status = response.status();
                    let text = response.text().await.unwrap();
                    prop_assert!(!status.is_server_error(), "{status}: {text}");
                    if status.is_client_error() {
                        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                        prop_assert!(v["error"]["code"].is_string(), "{status}: {text}");
                    }
                    Ok(())
                })
            },
        )
        .unwrap();
    rt.block_on(async {
        let health = app
            .client
            .get(format!("{}/healthz", app.address))
            .send()
            .await
            .unwrap();
        assert_eq!(health.status(), 200);
        app.stop().await;
    });
}

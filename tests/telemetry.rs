//! Traces over OTLP/HTTP: an in-process collector on a real socket receives
//! what the exporter sends (JSON encoding of OTLP) and the test reads the
//! trace of one hedged job: a `job` span with one `attempt` child per
//! attempt, continuing the trace id of the client's `traceparent`. One test
//! per binary: the tracing subscriber is global.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use axum::routing::post;
use common::world::{route, start_world, ProviderSpec};
use common::{chat_body, Backend};
use onejob::domain::JobId;
use serde_json::Value;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// Every span the collector received, flattened.
fn spans(received: &Mutex<Vec<Value>>) -> Vec<Value> {
    let bodies = received.lock().unwrap();
    let mut out = Vec::new();
    for body in bodies.iter() {
        for rs in body["resourceSpans"].as_array().into_iter().flatten() {
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                out.extend(ss["spans"].as_array().into_iter().flatten().cloned());
            }
        }
    }
    out
}

fn attribute<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)?["value"]["stringValue"]
        .as_str()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_is_one_trace_with_a_span_per_attempt_continuing_the_clients_traceparent() {
    // The collector: OTLP/HTTP's traces endpoint, JSON bodies kept.
    let received: Arc<Mutex<Vec<Value>>> = Arc::default();
    let store = received.clone();
    let collector = axum::Router::new().route(
        "/v1/traces",
        post(move |body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                let value: Value = serde_json::from_slice(&body).expect("OTLP JSON");
                store.lock().unwrap().push(value);
                axum::Json(serde_json::json!({}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, collector).await.unwrap() });

    let telemetry = onejob::telemetry::TelemetryConfig {
        otlp_endpoint: Some(endpoint.clone()),
        ..Default::default()
    };
    let guard = Arc::new(onejob::telemetry::init(&telemetry).unwrap());

    // A provider call made inside a span carries that span as traceparent.
    {
        let span = tracing::info_span!("probe");
        let _entered = span.enter();
        let request =
            onejob::telemetry::with_trace_context(reqwest::Client::new().get("http://x/"))
                .build()
                .unwrap();
        let header = request.headers()["traceparent"]
            .to_str()
            .unwrap()
            .to_string();
        assert!(header.starts_with("00-") && header.len() == 55, "{header}");
    }

    let providers = [
        ProviderSpec {
            name: "slow",
            model: "healthy:latency=600",
        },
        ProviderSpec {
            name: "quick",
            model: "healthy:latency=30",
        },
    ];
    let mut r = route("slow", &["quick"]);
    r.silence_ms = 150;
    let world = start_world(Backend::Sqlite, &providers, r, |c| {
        c.engine.loser_grace_ms = 5_000;
        c.telemetry = telemetry.clone();
    })
    .await;
    let response = world
        .client
        .post(format!("{}/v1/jobs", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", "traced-1")
        .header("traceparent", format!("00-{TRACE_ID}-{CLIENT_SPAN}-01"))
        .json(&chat_body("trace me"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let job: Value = response.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world
        .until(&id, Duration::from_secs(10), |_, a| {
            a.len() == 2 && a.iter().all(|a| a["state"] != "started")
        })
        .await;

    // Export what has ended, then read it back from the collector.
    let deadline = Instant::now() + Duration::from_secs(10);
    let (job_span, children) = loop {
        let flush = guard.clone();
        tokio::task::spawn_blocking(move || flush.flush())
            .await
            .unwrap();
        let all = spans(&received);
        let job_span = all
            .iter()
            .find(|s| s["name"] == "job" && attribute(s, "job_id") == Some(id.as_str()))
            .cloned();
        if let Some(job_span) = job_span {
            let children: Vec<Value> = all
                .iter()
                .filter(|s| s["name"] == "attempt" && s["parentSpanId"] == job_span["spanId"])
                .cloned()
                .collect();
            if children.len() == 2 {
                break (job_span, children);
            }
        }
        assert!(Instant::now() < deadline, "no complete trace; got {all:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let all = spans(&received);
    assert_eq!(
        job_span["traceId"], TRACE_ID,
        "the client's trace continues"
    );
    // Up from the job: the request that created it (through its handler's
    // spans), whose parent is the client's span.
    let mut parent = job_span["parentSpanId"].clone();
    let request = loop {
        let span = all
            .iter()
            .find(|s| s["spanId"] == parent)
            .unwrap_or_else(|| panic!("span {parent} is not in the trace: {all:#?}"));
        if span["name"] == "request" {
            break span;
        }
        parent = span["parentSpanId"].clone();
    };
    assert_eq!(request["parentSpanId"], CLIENT_SPAN);
    assert_eq!(request["traceId"], TRACE_ID);
    let mut seen: Vec<(String, String)> = children
        .iter()
        .map(|s| {
            assert_eq!(s["traceId"], TRACE_ID);
            (
                attribute(s, "attempt_id").unwrap().to_string(),
                attribute(s, "kind").unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    let mut expected: Vec<(String, String)> = attempts
        .iter()
        .map(|a| {
            (
                a["id"].as_str().unwrap().to_string(),
                a["kind"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    expected.sort();
    assert_eq!(seen, expected, "one span per attempt, each its own");

    // The simulator (a real server) received each attempt's call with a
    // traceparent in the job's trace whose parent is a span under that
    // attempt's span: a provider that traces joins the same trace there.
    for attempt in &attempts {
        let provider = attempt["provider"].as_str().unwrap();
        let key = onejob::providers::stable_key(&JobId::from(&id), provider);
        let received = world.sim.ledger().traceparents(&key);
        assert!(
            !received.is_empty(),
            "{provider}: no traceparent reached the simulator"
        );
        for header in received {
            let parts: Vec<&str> = header.split('-').collect();
            assert_eq!(parts.len(), 4, "{header}");
            assert_eq!(
                parts[1], TRACE_ID,
                "{provider}: {header} is in another trace"
            );
            let mut at = Value::String(parts[2].to_string());
            let attempt_span = loop {
                let span = all
                    .iter()
                    .find(|s| s["spanId"] == at)
                    .unwrap_or_else(|| panic!("{header}: span {at} is not in the trace"));
                if span["name"] == "attempt" {
                    break span;
                }
                at = span["parentSpanId"].clone();
            };
            assert_eq!(
                attribute(attempt_span, "attempt_id"),
                attempt["id"].as_str(),
                "{provider}: the call continues its own attempt's span"
            );
        }
    }
    world.stop().await;
}

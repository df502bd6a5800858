//! The engine's scenarios over a table of provider kinds: the same scenario
//! on `openai`, `anthropic`, `gemini`, `bedrock` and `azure_openai`, each a
//! provider file of that kind pointing at the built-in simulator (which
//! speaks every one of those wires), on both backends.
//!
//! | scenario | what the user sees |
//! |---|---|
//! | a hedge after silence | the fallback answers; the slow primary is discarded |
//! | an unknown after a reset | the fallback answers; the primary is settled by lookup (openai) or, past unknown_deadline_ms, let go |
//! | a cut stream | continued on a prefill-capable fallback (anthropic), else restarted on the fallback: one whole answer either way |
//! | the breaker | after `breaker_threshold` 503s new jobs skip the primary |
//! | a context overflow | the next larger window answers; nothing re-sent to the refuser |
//!
//! Every provider of a world is of the kind under test, so each scenario
//! exercises that kind's adapter in both roles, primary and fallback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, set_window, start_world, ProviderSpec, World};
use common::Backend;
use onejob::config::{Config, RouteConfig};
use onejob::domain::JobId;
use serde_json::{json, Value};
use std::time::Duration;

/// The scenarios × the kinds: `SCENARIO::KIND::{sqlite,postgres}`.
macro_rules! kinds_table {
    ($($scenario:ident),* $(,)?) => {
        $(
            mod $scenario {
                use super::{Kind, Backend};
                async fn openai(backend: Backend) { super::$scenario(backend, Kind::OpenAi).await }
                async fn anthropic(backend: Backend) { super::$scenario(backend, Kind::Anthropic).await }
                async fn gemini(backend: Backend) { super::$scenario(backend, Kind::Gemini).await }
                async fn bedrock(backend: Backend) { super::$scenario(backend, Kind::Bedrock).await }
                async fn azure_openai(backend: Backend) { super::$scenario(backend, Kind::AzureOpenAi).await }
                crate::on_both_backends!(openai, anthropic, gemini, bedrock, azure_openai);
            }
        )*
    };
}

kinds_table!(
    a_hedge_after_silence_wins,
    an_unknown_after_a_reset_is_answered_by_the_fallback,
    a_cut_stream_is_continued_or_restarted,
    the_breaker_sends_later_jobs_straight_to_the_fallback,
    a_context_overflow_moves_to_a_larger_window,
    a_streamed_content_filter_fails_after_one_attempt,
);

const WAIT: Duration = Duration::from_secs(15);

// Credentials the provider files name (the simulator checks none of them).
const KEY_ENV: &str = "ONEJOB_TEST_KINDS_API_KEY";
const AWS_KEY_ID_ENV: &str = "ONEJOB_TEST_KINDS_AWS_KEY_ID";
const AWS_SECRET_ENV: &str = "ONEJOB_TEST_KINDS_AWS_SECRET";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    OpenAi,
    Anthropic,
    Gemini,
    Bedrock,
    AzureOpenAi,
}

impl Kind {
    /// The lines of a provider file of this kind asking the simulator at
    /// `base_url` for `model` (a behaviour spec), beyond what every kind
    /// shares (tokenizer, window, timeouts).
    fn lines(self, base_url: &str, model: &str) -> String {
        match self {
            // OpenAI stores completions by key when asked: the one kind
            // whose unknown attempts can be looked up.
            Kind::OpenAi => format!(
                "kind = \"openai\"\nbase_url = \"{base_url}\"\nmodel = \"{model}\"\n\
                 api_key_env = \"{KEY_ENV}\"\nstore = true\nlookup = \"openai_stored\"\n"
            ),
            Kind::Anthropic => format!(
                "kind = \"anthropic\"\nbase_url = \"{base_url}\"\nmodel = \"{model}\"\n\
                 api_key_env = \"{KEY_ENV}\"\nlookup = \"none\"\n"
            ),
            Kind::Gemini => format!(
                "kind = \"gemini\"\nbase_url = \"{base_url}\"\nmodel = \"{model}\"\n\
                 api_key_env = \"{KEY_ENV}\"\nlookup = \"none\"\n"
            ),
            Kind::Bedrock => format!(
                "kind = \"bedrock\"\nbase_url = \"{base_url}\"\nregion = \"us-east-1\"\n\
                 model = \"{model}\"\naccess_key_id_env = \"{AWS_KEY_ID_ENV}\"\n\
                 secret_access_key_env = \"{AWS_SECRET_ENV}\"\nlookup = \"none\"\n"
            ),
            // The simulator takes the behaviour from the body's model.
            Kind::AzureOpenAi => format!(
                "kind = \"azure_openai\"\nbase_url = \"{base_url}\"\nmodel = \"{model}\"\n\
                 deployment = \"sim-deployment\"\napi_version = \"2024-10-21\"\n\
                 api_key_env = \"{KEY_ENV}\"\nlookup = \"none\"\n"
            ),
        }
    }

    /// `supports_prefill`'s default for the kind: a cut stream is continued
    /// on a fallback of this kind.
    fn continues_prefill(self) -> bool {
        self == Kind::Anthropic
    }

    /// Whether an unknown attempt of this kind can be looked up by key.
    fn looks_up(self) -> bool {
        self == Kind::OpenAi
    }
}

/// Rewrite provider `name` of a world (a `kind = "sim"` file written by the
/// harness) as a file of `kind` asking the same simulator for `model`; the
/// window stays 16384 (so `set_window` still applies), keys are not
/// honoured (the kinds' default).
fn rewrite_as(config: &Config, kind: Kind, name: &str, model: &str) {
    let path = config.providers_dir.join(format!("{name}.toml"));
    let sim = std::fs::read_to_string(&path).unwrap();
    let base_url = sim
        .lines()
        .find_map(|l| l.strip_prefix("base_url = \""))
        .and_then(|l| l.strip_suffix('"'))
        .unwrap()
        .to_string();
    let text = format!(
        "{}tokenizer = \"o200k_base\"\ncontext_window = 16384\nhonours_idempotency_key = false\n\
         [timeouts]\nconnect_ms = 1000\nfirst_byte_ms = 30000\ntotal_ms = 30000\n",
        kind.lines(&base_url, model)
    );
    std::fs::write(path, text).unwrap();
}

/// A world whose providers (name, behaviour) are all of `kind`.
async fn kind_world(
    backend: Backend,
    kind: Kind,
    providers: &[(&'static str, &'static str)],
    route: RouteConfig,
    tune: impl FnOnce(&mut Config),
) -> World {
    std::env::set_var(KEY_ENV, "sk-kinds-test");
    std::env::set_var(AWS_KEY_ID_ENV, "AKIDEXAMPLE");
    std::env::set_var(AWS_SECRET_ENV, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
    let specs: Vec<ProviderSpec> = providers
        .iter()
        .map(|&(name, model)| ProviderSpec { name, model })
        .collect();
    start_world(backend, &specs, route, |c| {
        for &(name, model) in providers {
            rewrite_as(c, kind, name, model);
        }
        tune(c);
    })
    .await
}

fn body(text: &str, stream: bool) -> Value {
    json!({
        "model": "default",
        "messages": [{"role": "user", "content": text}],
        "stream": stream,
    })
}

/// `POST /v1/chat/completions` (not streamed): status, headers, body.
async fn complete(
    world: &World,
    key: &str,
    text: &str,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", key)
        .json(&body(text, false))
        .send()
        .await
        .unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    (status, headers, response.json().await.unwrap())
}

/// One SSE event's data, as the client saw it.
async fn stream(
    world: &World,
    key: &str,
    text: &str,
) -> (u16, reqwest::header::HeaderMap, Vec<Value>) {
    let response = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .header("Idempotency-Key", key)
        .json(&body(text, true))
        .send()
        .await
        .unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    let text = response.text().await.unwrap();
    let events = text
        .split("\n\n")
        .filter_map(|block| {
            let data: String = block
                .lines()
                .filter_map(|l| l.strip_prefix("data: "))
                .collect();
            (!data.is_empty()).then(|| serde_json::from_str(&data).unwrap_or(Value::String(data)))
        })
        .collect();
    (status, headers, events)
}

fn content(events: &[Value]) -> String {
    events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect()
}

fn finish_reasons(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| {
            e["choices"][0]["finish_reason"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

fn error_event(events: &[Value]) -> Option<Value> {
    events
        .iter()
        .find(|v| v.get("error").is_some())
        .map(|v| v["error"].clone())
}

fn ends_done(events: &[Value]) -> bool {
    events.last() == Some(&json!("[DONE]"))
}

fn job_id(headers: &reqwest::header::HeaderMap) -> String {
    headers["x-onejob-job-id"].to_str().unwrap().to_string()
}

fn provider(headers: &reqwest::header::HeaderMap) -> &str {
    headers["x-onejob-provider"].to_str().unwrap()
}

fn answer_text(completion: &Value) -> &str {
    completion["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("no text answer: {completion}"))
}

/// (provider, state) of each attempt, in order.
fn path(attempts: &[Value]) -> Vec<(String, String)> {
    attempts
        .iter()
        .map(|a| {
            (
                a["provider"].as_str().unwrap().to_string(),
                a["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn pair(provider: &str, state: &str) -> (String, String) {
    (provider.to_string(), state.to_string())
}

/// What a healthy simulator answers to `text` (the answer is a function of
/// the prompt alone, whatever the wire).
async fn healthy_answer(world: &World, text: &str) -> String {
    let answer: Value = world
        .client
        .post(format!("{}/v1/chat/completions", world.sim.base_url()))
        .json(&json!({"model": "healthy", "messages": [{"role": "user", "content": text}]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    answer_text(&answer).to_string()
}

/// What the simulator generated for the job at the fallback (given a
/// prefill, only the rest of the answer).
fn fallback_output(world: &World, job_id: &str) -> String {
    let key = onejob::providers::stable_key(&JobId::from(job_id), "fallback");
    world.sim.ledger().answer(&key).unwrap().output
}

/// 1. The primary answers only after `silence_ms`: the hedge to the
///    fallback wins the compare-and-swap and the primary, answering late,
///    is discarded. Each executed once.
async fn a_hedge_after_silence_wins(backend: Backend, kind: Kind) {
    let mut r = route("primary", &["fallback"]);
    r.silence_ms = 150;
    let world = kind_world(
        backend,
        kind,
        &[("primary", "healthy:latency=1500"), ("fallback", "healthy")],
        r,
        |_| {},
    )
    .await;
    let (status, headers, answer) = complete(&world, "hedge-1", "Explain tides").await;
    assert_eq!(status, 200, "{kind:?}: {answer}");
    assert_eq!(provider(&headers), "fallback", "{kind:?}");
    assert_eq!(
        answer_text(&answer),
        healthy_answer(&world, "Explain tides").await,
        "{kind:?}"
    );
    let id = job_id(&headers);
    let (job, attempts) = world
        .until(&id, WAIT, |_, a| a.iter().all(|a| a["state"] != "started"))
        .await;
    assert_eq!(job["state"], "succeeded", "{kind:?}");
    assert_eq!(
        path(&attempts),
        vec![pair("primary", "discarded"), pair("fallback", "succeeded")],
        "{kind:?}"
    );
    assert_eq!(attempts[1]["kind"], "hedge", "{kind:?}");
    assert_eq!(job["completed_by"], attempts[1]["id"], "{kind:?}");
    assert_eq!(world.executions(&id, "primary"), 1, "{kind:?}");
    assert_eq!(world.executions(&id, "fallback"), 1, "{kind:?}");
    world.stop().await;
}

/// 2. The primary executes, then its connection is reset: the attempt is
///    `unknown` (never failed), nothing is re-sent there, and the fallback
///    answers at once. Where the kind can be looked up (openai, stored
///    completions) the reconciler finds the executed work, whose late
///    result loses the compare-and-swap: `discarded`. Where it cannot, past
///    `unknown_deadline_ms` the reconciler still cannot tell; the job has
///    succeeded without it, so the attempt is let go (`discarded`, with the
///    reason) and the job does not go to review.
async fn an_unknown_after_a_reset_is_answered_by_the_fallback(backend: Backend, kind: Kind) {
    let mut r = route("primary", &["fallback"]);
    // Only the rescue hedges this soon.
    r.silence_ms = 60_000;
    r.unknown_deadline_ms = 200;
    let world = kind_world(
        backend,
        kind,
        &[("primary", "drop_response"), ("fallback", "healthy")],
        r,
        |c| {
            // The reconciler asks only after the rescue has had its chance.
            c.engine.reconcile_min_age_ms = 2_000;
        },
    )
    .await;
    let (status, headers, answer) = complete(&world, "reset-1", "Explain tides").await;
    assert_eq!(status, 200, "{kind:?}: {answer}");
    assert_eq!(provider(&headers), "fallback", "{kind:?}");
    let id = job_id(&headers);
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts.len(), 2, "{kind:?}: {attempts:?}");
    assert_eq!(attempts[1]["kind"], "hedge", "{kind:?}");
    assert_eq!(world.executions(&id, "primary"), 1, "{kind:?}");
    assert_eq!(world.executions(&id, "fallback"), 1, "{kind:?}");
    if kind.looks_up() {
        let (job, attempts) = world
            .until(&id, WAIT, |_, a| a[0]["state"] != "unknown")
            .await;
        assert_eq!(job["state"], "succeeded", "{kind:?}");
        assert_eq!(job["completed_by"], attempts[1]["id"], "{kind:?}");
        assert_eq!(attempts[0]["state"], "discarded", "{kind:?}: {attempts:?}");
        assert!(world.counter("onejob_reconciled_found_total").await >= 1.0);
    } else {
        assert_eq!(attempts[0]["state"], "unknown", "{kind:?}: {attempts:?}");
        // Past the deadline the reconciler still cannot tell; the job has
        // finished without the attempt, so it is let go (discarded, with
        // the reason), not asked about on every pass, and the succeeded
        // job does not go to review.
        let (job, attempts) = world
            .until(&id, WAIT, |_, a| a[0]["state"] != "unknown")
            .await;
        assert_eq!(job["state"], "succeeded", "{kind:?}: {job}");
        assert_eq!(job["completed_by"], attempts[1]["id"], "{kind:?}");
        assert_eq!(attempts[0]["state"], "discarded", "{kind:?}: {attempts:?}");
        let why = attempts[0]["error_message"].as_str().unwrap_or_default();
        assert!(
            why.contains("cannot say whether it ran"),
            "{kind:?}: {attempts:?}"
        );
        assert!(world.counter("onejob_reconciled_cannot_tell_total").await >= 1.0);
        assert!(world.counter("onejob_reconciled_abandoned_total").await >= 1.0);
        assert_eq!(world.counter("onejob_reconciled_found_total").await, 0.0);
    }
    assert_eq!(
        world.deliveries(&id, "primary"),
        1,
        "{kind:?}: nothing re-sent to the provider whose outcome was unknown"
    );
    world.stop().await;
}

/// 3. A stream cut after two pieces: on a kind that continues a prefill
///    (anthropic) the fallback finishes it and the client gets one whole
///    answer; on any other the fallback restarts the answer without the
///    prefill, its repetition of what the client has is held back, and the
///    client gets the rest: one whole answer either way.
async fn a_cut_stream_is_continued_or_restarted(backend: Backend, kind: Kind) {
    let world = kind_world(
        backend,
        kind,
        &[("primary", "stream_cut:tokens=2"), ("fallback", "healthy")],
        route("primary", &["fallback"]),
        |c| {
            // The reconciler asks only after the stream has ended (openai's
            // lookup would find the whole answer the simulator made).
            c.engine.reconcile_min_age_ms = 2_000;
        },
    )
    .await;
    let (status, headers, events) = stream(&world, "cut-1", "Explain tides").await;
    assert_eq!(status, 200, "{kind:?}: {events:?}");
    let id = job_id(&headers);
    let whole = healthy_answer(&world, "Explain tides").await;
    let text = content(&events);
    let attempts = world.attempts(&id).await;
    assert_eq!(attempts[0]["provider"], "primary", "{kind:?}");
    assert_eq!(
        attempts[0]["error_kind"], "stream_cut",
        "{kind:?}: {attempts:?}"
    );
    assert_eq!(world.executions(&id, "primary"), 1, "{kind:?}");
    if kind.continues_prefill() {
        assert!(error_event(&events).is_none(), "{kind:?}: {events:?}");
        assert_eq!(text, whole, "{kind:?}: one whole answer");
        assert_eq!(finish_reasons(&events), vec!["stop"], "{kind:?}");
        assert!(ends_done(&events), "{kind:?}");
        let job = world.job(&id).await;
        assert_eq!(job["state"], "succeeded", "{kind:?}");
        assert_eq!(job["result"], json!(text), "{kind:?}");
        assert_eq!(
            path(&attempts)[1],
            pair("fallback", "succeeded"),
            "{kind:?}: {attempts:?}"
        );
        assert_eq!(world.executions(&id, "fallback"), 1, "{kind:?}");
        assert_eq!(
            format!("{}{}", &text[..32], fallback_output(&world, &id)),
            whole,
            "{kind:?}: the fallback was asked to continue after the 32 characters sent"
        );
    } else {
        // No fallback continues a prefill: it is asked for the whole answer
        // again, its repetition of the 32 characters sent is held back, and
        // the client gets the rest once.
        assert!(error_event(&events).is_none(), "{kind:?}: {events:?}");
        assert_eq!(text, whole, "{kind:?}: one whole answer, nothing repeated");
        assert_eq!(finish_reasons(&events), vec!["stop"], "{kind:?}");
        assert!(ends_done(&events), "{kind:?}");
        let job = world.job(&id).await;
        assert_eq!(job["state"], "succeeded", "{kind:?}");
        assert_eq!(job["result"], json!(text), "{kind:?}");
        assert_eq!(
            (
                attempts[1]["provider"].as_str(),
                attempts[1]["kind"].as_str(),
                attempts[1]["state"].as_str()
            ),
            (Some("fallback"), Some("hedge"), Some("succeeded")),
            "{kind:?}: {attempts:?}"
        );
        assert_eq!(job["completed_by"], attempts[1]["id"], "{kind:?}");
        assert_eq!(world.executions(&id, "fallback"), 1, "{kind:?}");
        assert_eq!(
            fallback_output(&world, &id),
            whole,
            "{kind:?}: asked for the whole answer, not to continue the cut one"
        );
        // The cut attempt: found executed and discarded where it can be
        // looked up, else it stays unknown (until unknown_deadline_ms, 10
        // minutes here, lets it go).
        let cut_ends = if kind.looks_up() {
            "discarded"
        } else {
            "unknown"
        };
        let (_, attempts) = world
            .until(&id, WAIT, |_, a| {
                a[0]["state"] != "unknown" || !kind.looks_up()
            })
            .await;
        assert_eq!(attempts[0]["state"], cut_ends, "{kind:?}: {attempts:?}");
        let (_, _, replay) = stream(&world, "cut-1", "Explain tides").await;
        assert_eq!(
            content(&replay),
            whole,
            "{kind:?}: a replay returns the final answer"
        );
        assert!(ends_done(&replay), "{kind:?}");
    }
    assert_eq!(world.executions(&id, "primary"), 1, "{kind:?}");
    world.stop().await;
}

/// 4. A primary that keeps answering 503: after `breaker_threshold` jobs
///    failed over its breaker opens, and later jobs go straight to the
///    fallback; the primary's ledger stops growing.
async fn the_breaker_sends_later_jobs_straight_to_the_fallback(backend: Backend, kind: Kind) {
    let mut r = route("primary", &["fallback"]);
    // Each 503 fails over at once, so three jobs make three failures.
    r.same_provider_retries = 0;
    let world = kind_world(
        backend,
        kind,
        &[("primary", "fail:503"), ("fallback", "healthy")],
        r,
        |c| {
            c.engine.breaker_threshold = 3;
            // No probe while the test runs.
            c.engine.breaker_open_ms = 600_000;
        },
    )
    .await;
    let mut primary_deliveries = 0;
    for i in 0..5 {
        let (status, headers, answer) =
            complete(&world, &format!("breaker-{i}"), &format!("job {i}")).await;
        assert_eq!(status, 200, "{kind:?} job {i}: {answer}");
        assert_eq!(provider(&headers), "fallback", "{kind:?} job {i}");
        let id = job_id(&headers);
        let attempts = world.attempts(&id).await;
        if i < 3 {
            assert_eq!(
                path(&attempts),
                vec![pair("primary", "failed"), pair("fallback", "succeeded")],
                "{kind:?} job {i}"
            );
            assert_eq!(
                attempts[0]["error_kind"], "unavailable",
                "{kind:?} job {i}: {attempts:?}"
            );
        } else {
            assert_eq!(
                path(&attempts),
                vec![pair("fallback", "succeeded")],
                "{kind:?} job {i}: the open breaker skips the primary"
            );
        }
        primary_deliveries += world.deliveries(&id, "primary");
    }
    assert_eq!(
        primary_deliveries, 3,
        "{kind:?}: the primary's ledger stopped growing"
    );
    let metrics = world.metrics().await;
    assert!(
        metrics.contains("onejob_breaker_open{provider=\"primary\"} 1"),
        "{kind:?}: {metrics}"
    );
    world.stop().await;
}

/// 5. The primary refuses the prompt as too long for its window: the job
///    moves to the next provider on the route whose window is larger (the
///    smaller one is skipped), and is never re-sent to the one that refused.
async fn a_context_overflow_moves_to_a_larger_window(backend: Backend, kind: Kind) {
    let world = kind_world(
        backend,
        kind,
        &[
            ("primary", "context_length"),
            ("small", "healthy"),
            ("large", "healthy"),
        ],
        route("primary", &["small", "large"]),
        |c| {
            set_window(c, "small", 8_192);
            set_window(c, "large", 32_768);
        },
    )
    .await;
    let (status, headers, answer) = complete(&world, "ctx-1", "Hello").await;
    assert_eq!(status, 200, "{kind:?}: {answer}");
    assert_eq!(provider(&headers), "large", "{kind:?}");
    assert_eq!(
        answer_text(&answer),
        healthy_answer(&world, "Hello").await,
        "{kind:?}"
    );
    let id = job_id(&headers);
    let attempts = world.attempts(&id).await;
    assert_eq!(
        path(&attempts),
        vec![pair("primary", "failed"), pair("large", "succeeded")],
        "{kind:?}"
    );
    assert_eq!(
        attempts[0]["error_kind"], "context_length_exceeded",
        "{kind:?}"
    );
    assert_eq!(
        world.deliveries(&id, "primary"),
        1,
        "{kind:?}: never re-sent to the provider that refused it"
    );
    assert_eq!(
        world.deliveries(&id, "small"),
        0,
        "{kind:?}: a smaller window is skipped"
    );
    assert_eq!(world.executions(&id, "large"), 1, "{kind:?}");
    world.stop().await;
}

/// A provider that filters the prompt, streamed, on each wire: one failed
/// attempt, the refusal told in the stream, no fallback tried (it would be
/// asked the same). The simulator's Gemini wire answered a streamed filter
/// as plain JSON, which onejob read as a stream cut short: the attempt was
/// `unknown` and the job waited for review.
async fn a_streamed_content_filter_fails_after_one_attempt(backend: Backend, kind: Kind) {
    let world = kind_world(
        backend,
        kind,
        &[("primary", "content_filter"), ("backup", "healthy")],
        route("primary", &["backup"]),
        |_| {},
    )
    .await;
    let (_, headers, events) = stream(&world, "filtered", "Hello").await;
    let id = job_id(&headers);
    let error = error_event(&events).unwrap_or_else(|| panic!("no error event: {events:?}"));
    assert_eq!(error["code"], "content_policy_violation", "{error}");
    assert_eq!(
        path(&world.attempts(&id).await),
        vec![pair("primary", "failed")],
        "one attempt"
    );
    assert_eq!(world.job(&id).await["state"], "failed");
    world.stop().await;
}

//! The simulator over real sockets: the ledger is the ground truth for
//! "executed once", and healthy answers validate against the request schema.
#![allow(clippy::unwrap_used)]

mod upstream;

use onejob::domain::request::{Message, Role};
use onejob::providers::config::ProviderConfig;
use onejob::providers::{build_provider, AttemptOutcome, ChatRequest, Lookup, Provider};
use onejob::sim::{SimHandle, SimServer};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

fn sim_provider(sim: &SimHandle, model: &str, extra: &str) -> Arc<dyn Provider> {
    let text = format!(
        "kind = \"sim\"\nbase_url = \"{}\"\nmodel = \"{model}\"\ntokenizer = \"o200k_base\"\n\
         context_window = 16384\nlookup = \"sim_ledger\"\n{extra}\n\
         [timeouts]\nconnect_ms = 300\nfirst_byte_ms = 400\ntotal_ms = 800\n",
        sim.base_url()
    );
    let config = ProviderConfig::parse(&text, Path::new("providers/sim.toml")).unwrap();
    build_provider("sim", &config).unwrap()
}

fn schema() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "required": ["label", "score", "ratio", "ok", "tags", "note", "detail"],
        "properties": {
            "label": {"type": "string", "enum": ["spam", "ham", "unsure"]},
            "summary": {"type": "string", "minLength": 5, "maxLength": 12},
            "score": {"type": "integer", "minimum": -3, "maximum": 3},
            "ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "minItems": 1, "maxItems": 4},
            "note": {"type": ["string", "null"], "maxLength": 3},
            "detail": {
                "type": "object", "additionalProperties": false, "required": ["id"],
                "properties": {"id": {"type": "integer", "minimum": 1}, "flag": {"type": ["boolean", "null"]}}
            }
        }
    })
}

fn prompt(text: &str, key: &str) -> ChatRequest {
    ChatRequest {
        system: Some("Classify the message. Answer with JSON only.".into()),
        messages: vec![Message::new(Role::User, text)],
        temperature: Some(0.0),
        max_tokens: Some(128),
        top_p: None,
        response_schema: Some(schema()),
        idempotency_key: key.into(),
        options: onejob::providers::ChatOptions::default(),
    }
}

fn succeeded(outcome: AttemptOutcome) -> onejob::providers::Success {
    match outcome {
        AttemptOutcome::Succeeded(s) => s,
        other => panic!("expected success, got {other:?}"),
    }
}

#[tokio::test]
async fn dropped_response_is_unknown_executed_once_and_replayed_by_key() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let provider = sim_provider(&sim, "drop_response", "");
    let request = prompt("win a prize now", "job-1-sim");

    let first = provider.call(&request).await;
    assert!(matches!(&first, AttemptOutcome::Unknown(_)), "{first:?}");
    assert_eq!(sim.ledger().executions("job-1-sim"), 1);

    let Lookup::Found(found) = provider.lookup("job-1-sim").await else {
        panic!("ledger lookup")
    };
    let replay = succeeded(provider.call(&request).await);
    assert_eq!(replay.output, found.output);
    assert_eq!(
        sim.ledger().answer("job-1-sim").unwrap().output,
        replay.output
    );
    assert_eq!(
        sim.ledger().executions("job-1-sim"),
        1,
        "a replay must not execute again"
    );
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn lookup_none_means_cannot_tell_for_the_simulator_too() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let ledger = sim_provider(&sim, "drop_response", "");
    let text = format!(
        "kind = \"sim\"\nbase_url = \"{}\"\nmodel = \"drop_response\"\ntokenizer = \"o200k_base\"\n\
         context_window = 16384\nlookup = \"none\"\n",
        sim.base_url()
    );
    let config = ProviderConfig::parse(&text, Path::new("providers/blind.toml")).unwrap();
    let blind = build_provider("blind", &config).unwrap();
    let outcome = blind.call(&prompt("win a prize now", "job-blind")).await;
    assert!(
        matches!(&outcome, AttemptOutcome::Unknown(_)),
        "{outcome:?}"
    );
    assert_eq!(sim.ledger().executions("job-blind"), 1);
    // The ledger holds the answer, yet a provider configured without lookup cannot tell.
    assert!(matches!(ledger.lookup("job-blind").await, Lookup::Found(_)));
    assert!(
        matches!(blind.lookup("job-blind").await, Lookup::CannotTell(_)),
        "lookup = \"none\" must not read the ledger"
    );
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn never_executed_key_is_not_found_and_failures_execute_nothing() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let provider = sim_provider(&sim, "fail:503", "");
    let outcome = provider.call(&prompt("hello", "k-503")).await;
    assert!(
        matches!(&outcome, AttemptOutcome::Failed(f) if f.retryable && f.status == Some(503)),
        "{outcome:?}"
    );
    assert_eq!(sim.ledger().executions("k-503"), 0);
    assert_eq!(provider.lookup("k-503").await, Lookup::NotFound);
}

#[tokio::test]
async fn healthy_output_validates_against_the_request_schema() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let provider = sim_provider(&sim, "healthy", "");
    let validator = jsonschema::validator_for(&schema()).unwrap();
    for i in 0..100 {
        let text = format!("message number {i}: {}", "lorem ".repeat(i % 7));
        let success = succeeded(provider.call(&prompt(&text, &format!("k-{i}"))).await);
        let value: Value = serde_json::from_str(&success.output).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&value)
            .map(|e| e.to_string())
            .collect();
        assert!(
            errors.is_empty(),
            "prompt {i}: {value} breaks the schema: {errors:?}"
        );
        let usage = success.usage.unwrap();
        assert!(usage.prompt_tokens > 0 && usage.completion_tokens > 0);
    }
    // Deterministic per prompt: another key, the same prompt, the same answer.
    let a = succeeded(provider.call(&prompt("same", "a")).await);
    let b = succeeded(provider.call(&prompt("same", "b")).await);
    assert_eq!(a.output, b.output);
    assert_eq!(sim.ledger().executions("a"), 1);
}

#[tokio::test]
async fn contract_breaking_behaviours_break_the_contract() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let validator = jsonschema::validator_for(&schema()).unwrap();

    let hallucinated = succeeded(
        sim_provider(&sim, "hallucinate_key", "")
            .call(&prompt("x", "h"))
            .await,
    );
    let value: Value = serde_json::from_str(&hallucinated.output).unwrap();
    assert!(
        !validator.is_valid(&value),
        "an invented top-level key must not validate: {value}"
    );

    let prose = succeeded(
        sim_provider(&sim, "ignore_system", "")
            .call(&prompt("x", "p"))
            .await,
    );
    assert!(
        serde_json::from_str::<Value>(&prose.output).is_err(),
        "{}",
        prose.output
    );

    let honest = succeeded(
        sim_provider(&sim, "healthy", "")
            .call(&prompt("x", "u1"))
            .await,
    );
    let wrong = succeeded(
        sim_provider(&sim, "wrong_usage", "")
            .call(&prompt("x", "u2"))
            .await,
    );
    assert!(wrong.usage.unwrap().prompt_tokens > honest.usage.unwrap().prompt_tokens);
}

#[tokio::test]
async fn fault_behaviours_classify_as_a_real_provider_would() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let call = |model: &'static str| {
        let provider = sim_provider(&sim, model, "");
        async move { provider.call(&prompt("x", model)).await }
    };
    let rate = call("rate_limit:retry_after=2").await;
    assert!(
        matches!(&rate, AttemptOutcome::Failed(f) if f.kind == "rate_limited" && f.retry_after == Some(Duration::from_secs(2))),
        "{rate:?}"
    );
    let reject = call("reject").await;
    assert!(
        matches!(&reject, AttemptOutcome::Failed(f) if !f.retryable),
        "{reject:?}"
    );
    let hang = call("hang").await;
    assert!(
        matches!(&hang, AttemptOutcome::Unknown(a) if a.kind == "timeout"),
        "{hang:?}"
    );
    assert_eq!(sim.ledger().executions("hang"), 0);
    let slow = call("slow_first_byte:ms=5000").await;
    assert!(
        matches!(&slow, AttemptOutcome::Unknown(a) if a.kind == "timeout"),
        "{slow:?}"
    );
    assert_eq!(
        sim.ledger().executions("slow_first_byte:ms=5000"),
        1,
        "executed, answered too late"
    );
    let unknown_model = call("gpt-4o").await;
    assert!(
        matches!(&unknown_model, AttemptOutcome::Failed(f) if f.kind == "not_found"),
        "{unknown_model:?}"
    );
    // Shutdown releases the hanging request instead of waiting for it forever.
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_key_reused_with_another_body_is_refused() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let provider = sim_provider(&sim, "healthy", "");
    succeeded(provider.call(&prompt("one body", "shared")).await);
    let other = provider.call(&prompt("another body", "shared")).await;
    assert!(
        matches!(&other, AttemptOutcome::Failed(f) if !f.retryable && f.status == Some(400)),
        "{other:?}"
    );
    assert_eq!(sim.ledger().executions("shared"), 1);
}

#[tokio::test]
async fn openai_stored_lookup_and_anthropic_wire_work_against_the_simulator() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let config = upstream::config(
        "openai",
        &sim.base_url(),
        "store = true\nlookup = \"openai_stored\"",
    );
    let mut config = config;
    config.model = "healthy".into();
    let openai = build_provider("openai", &config).unwrap();
    let answered = succeeded(openai.call(&prompt("stored", "stored-key")).await);
    let Lookup::Found(found) = openai.lookup("stored-key").await else {
        panic!("not stored")
    };
    assert_eq!(found.output, answered.output);
    assert_eq!(openai.lookup("other-key").await, Lookup::NotFound);

    let mut config = upstream::config("anthropic", &sim.base_url(), "");
    config.model = "healthy".into();
    let anthropic = build_provider("anthropic", &config).unwrap();
    let mut request = prompt("hi", "anthropic-key");
    request.response_schema = None;
    let success = succeeded(anthropic.call(&request).await);
    assert!(!success.output.is_empty());
    config.model = "overloaded".into();
    request.idempotency_key = "anthropic-overloaded-key".into();
    let overloaded = build_provider("anthropic", &config)
        .unwrap()
        .call(&request)
        .await;
    assert!(
        matches!(&overloaded, AttemptOutcome::Failed(f) if f.retryable && f.kind == "overloaded"),
        "{overloaded:?}"
    );
}

#[tokio::test]
async fn streams_can_be_cut_after_some_chunks() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let client = reqwest::Client::new();
    let send = |model: &str| {
        client
            .post(format!("{}/v1/chat/completions", sim.base_url()))
            .json(&json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "tell me"}]}))
            .send()
    };
    let whole = send("healthy").await.unwrap().text().await.unwrap();
    assert!(whole.ends_with("data: [DONE]\n\n"), "{whole}");
    let cut = send("stream_cut").await.unwrap();
    assert_eq!(cut.status(), 200, "headers arrive before the cut");
    let body = cut.text().await;
    assert!(body.is_err(), "a cut stream must end in an error: {body:?}");
}

/// ConverseStream on the Bedrock wire breaks as the other wires do:
/// `stream_cut:tokens=2` sends its start and two pieces of text, then cuts
/// the connection; `stream_stall:tokens=2` sends them, then falls silent.
#[tokio::test]
async fn bedrock_streams_can_be_cut_or_stalled_after_some_pieces() {
    use futures::StreamExt;
    use onejob::providers::eventstream::Decoder;
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let client = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": [{"text": "tell me"}]}]});
    // The events received (type, text) and whether the stream ended in an error,
    // reading until the end or `quiet` without a byte.
    let read = |model: &'static str, quiet: Duration| {
        let request = client
            .post(format!("{}/model/{model}/converse-stream", sim.base_url()))
            .json(&body);
        async move {
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200, "{model}");
            let mut bytes = response.bytes_stream();
            let (mut decoder, mut events) = (Decoder::default(), Vec::new());
            let ending = loop {
                match tokio::time::timeout(quiet, bytes.next()).await {
                    Err(_) => break "silent",
                    Ok(None) => break "end",
                    Ok(Some(Err(_))) => break "error",
                    Ok(Some(Ok(chunk))) => {
                        let (messages, bad) = decoder.push(&chunk);
                        assert_eq!(bad, None, "{model}");
                        for m in messages {
                            let payload: Value = serde_json::from_slice(&m.payload).unwrap();
                            let text = payload.pointer("/delta/text").and_then(Value::as_str);
                            events.push((
                                m.header(":event-type").unwrap().to_string(),
                                text.map(str::to_string),
                            ));
                        }
                    }
                }
            };
            (events, ending)
        }
    };
    let (whole, ending) = read("healthy", Duration::from_secs(5)).await;
    assert_eq!(ending, "end");
    assert_eq!(whole.last().unwrap().0, "metadata");
    let pieces =
        |events: &[(String, Option<String>)]| events.iter().filter(|(_, t)| t.is_some()).count();
    assert!(pieces(&whole) > 2, "{whole:?}");
    for (model, ends) in [
        ("stream_cut:tokens=2", "error"),
        ("stream_stall:tokens=2", "silent"),
    ] {
        let (events, ending) = read(model, Duration::from_millis(500)).await;
        assert_eq!(ending, ends, "{model}: {events:?}");
        assert_eq!(
            events,
            whole[..3].to_vec(),
            "{model}: its start and two pieces"
        );
        assert_eq!(pieces(&events), 2, "{model}");
    }
}

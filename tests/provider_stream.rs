//! Streamed calls: the OpenAI and Anthropic adapters read server-sent events
//! from fake upstreams and from the simulator; a stream that begins and then
//! breaks is `unknown`, never a success.
#![allow(clippy::unwrap_used)]

mod upstream;

use onejob::domain::request::{Message, Role};
use onejob::providers::config::ProviderConfig;
use onejob::providers::stream::Delta;
use onejob::providers::{build_provider, AttemptOutcome, ChatRequest, Provider, Streamed};
use onejob::sim::SimServer;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc;
use upstream::{json, upstream};

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

fn text(pieces: &[Delta]) -> String {
    pieces.iter().map(|d| d.content.as_str()).collect()
}

fn ask(content: &str) -> ChatRequest {
    ChatRequest {
        system: None,
        messages: vec![Message::new(Role::User, content)],
        temperature: None,
        max_tokens: Some(64),
        top_p: None,
        response_schema: None,
        idempotency_key: format!("k-{}", uuid::Uuid::new_v4()),
        options: Default::default(),
    }
}

#[tokio::test]
async fn openai_chunks_carry_text_tool_call_deltas_and_usage() {
    let sse = concat!(
        "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4,\"total_tokens\":13}}\n\n",
        "data: [DONE]\n\n",
    );
    let up = upstream(json(200, sse)).await;
    let provider = upstream::provider("openai", &up.base_url);
    let ((outcome, finish), pieces) = streamed(provider.as_ref(), &ask("hi")).await;
    assert_eq!(text(&pieces), "Hello");
    let calls: Vec<_> = pieces.iter().flat_map(|d| d.tool_calls.clone()).collect();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0]["function"]["name"], "f");
    assert_eq!(calls[1]["function"]["arguments"], "{}");
    let AttemptOutcome::Succeeded(s) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(s.output, "Hello");
    assert_eq!(
        s.tool_calls,
        vec![serde_json::json!({"id": "call_1", "type": "function",
                                "function": {"name": "f", "arguments": "{}"}})],
        "the deltas make the whole call"
    );
    assert_eq!(s.usage.unwrap().completion_tokens, 4);
    assert_eq!(finish.unwrap().finish_reason.name(), "tool_calls");
    let body = up.seen()[0].body.clone();
    assert_eq!(body["stream"], true);
    assert_eq!(body["stream_options"]["include_usage"], true);
}

#[tokio::test]
async fn anthropic_events_become_text_and_tool_call_deltas() {
    let sse = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"usage\":{\"input_tokens\":11,\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: ping\ndata: {\"type\":\"ping\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi \"}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"toolu_1\",\"name\":\"lookup\",\"input\":{}}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"q\\\":1}\"}}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"},\"usage\":{\"output_tokens\":7}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let up = upstream(json(200, sse)).await;
    let provider = upstream::provider("anthropic", &up.base_url);
    let ((outcome, finish), pieces) = streamed(provider.as_ref(), &ask("hi")).await;
    assert_eq!(text(&pieces), "Hi ");
    let calls: Vec<_> = pieces.iter().flat_map(|d| d.tool_calls.clone()).collect();
    assert_eq!(calls[0]["id"], "toolu_1");
    assert_eq!(calls[0]["function"]["name"], "lookup");
    assert_eq!(calls[1]["function"]["arguments"], "{\"q\":1}");
    let AttemptOutcome::Succeeded(s) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(s.usage.unwrap().prompt_tokens, 11);
    assert_eq!(s.usage.unwrap().completion_tokens, 7);
    assert_eq!(finish.unwrap().finish_reason.name(), "tool_calls");
}

#[tokio::test]
async fn an_error_status_before_the_stream_is_classified_as_unstreamed() {
    let up = upstream(upstream::json_with(
        429,
        vec![("retry-after", "3")],
        r#"{"error":{"message":"slow down","type":"rate_limit_error","code":"rate_limit_exceeded"}}"#,
    ))
    .await;
    let provider = upstream::provider("openai", &up.base_url);
    let ((outcome, _), pieces) = streamed(provider.as_ref(), &ask("hi")).await;
    assert!(pieces.is_empty());
    let AttemptOutcome::Failed(f) = outcome else {
        panic!("{outcome:?}")
    };
    assert!(f.retryable);
    assert_eq!(f.kind, "rate_limited");
    assert_eq!(f.retry_after, Some(std::time::Duration::from_secs(3)));
}

fn sim_provider(kind: &str, base_url: &str, model: &str) -> Arc<dyn Provider> {
    let text = format!(
        "kind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"{model}\"\n{}\
         tokenizer = \"o200k_base\"\ncontext_window = 16384\n",
        if kind == "sim" {
            ""
        } else {
            "api_key_env = \"ONEJOB_TEST_PROVIDER_KEY\"\n"
        }
    );
    std::env::set_var("ONEJOB_TEST_PROVIDER_KEY", "k");
    let config = ProviderConfig::parse(&text, Path::new("providers/s.toml")).unwrap();
    build_provider("s", &config).unwrap()
}

#[tokio::test]
async fn simulator_streams_on_both_wires_and_its_faults_end_unknown() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    for kind in ["sim", "anthropic"] {
        let request = ask("tell me something");
        let whole = match sim_provider(kind, &sim.base_url(), "healthy")
            .call(&request)
            .await
        {
            AttemptOutcome::Succeeded(s) => s.output,
            other => panic!("{kind}: {other:?}"),
        };
        let healthy = sim_provider(kind, &sim.base_url(), "healthy");
        let ((outcome, finish), pieces) =
            streamed(healthy.as_ref(), &ask("tell me something")).await;
        assert!(pieces.len() > 2, "{kind}: the answer comes in pieces");
        assert_eq!(text(&pieces), whole, "{kind}");
        assert!(matches!(outcome, AttemptOutcome::Succeeded(ref s) if s.output == whole));
        assert_eq!(finish.unwrap().finish_reason.name(), "stop");

        for (model, kind_expected, delivered) in [
            ("stream_cut:tokens=2", "stream_cut", Some(2)),
            ("stream_malformed:tokens=1", "malformed_chunk", Some(1)),
            ("stream_no_finish", "stream_incomplete", None),
        ] {
            let p = sim_provider(kind, &sim.base_url(), model);
            let ((outcome, finish), pieces) = streamed(p.as_ref(), &ask("tell me something")).await;
            assert!(finish.is_none());
            match outcome {
                AttemptOutcome::Unknown(a) => assert_eq!(a.kind, kind_expected, "{kind} {model}"),
                other => panic!("{kind} {model}: {other:?}"),
            }
            match delivered {
                Some(n) => assert_eq!(pieces.len(), n, "{kind} {model}"),
                None => assert_eq!(text(&pieces), whole, "{kind} {model}"),
            }
        }
        // Everything but the end marker (OpenAI's `[DONE]`, which some
        // compatible servers never send; Anthropic's `message_stop`): the
        // provider said why it stopped, so a clean close ends the answer,
        // on every wire (as 2 s of silence after the finish does).
        let p = sim_provider(kind, &sim.base_url(), "stream_no_done");
        let ((outcome, finish), pieces) = streamed(p.as_ref(), &ask("tell me something")).await;
        assert_eq!(text(&pieces), whole, "{kind}");
        match outcome {
            AttemptOutcome::Succeeded(s) => {
                assert_eq!(s.output, whole);
                assert!(s.usage.is_some(), "{kind}: the usage came before the close");
                assert_eq!(finish.unwrap().finish_reason.name(), "stop");
            }
            other => panic!("{kind} stream_no_done: {other:?}"),
        }
    }
    sim.shutdown().await.unwrap();
}

#[tokio::test]
async fn simulator_continues_a_prefill_unless_told_to_refuse_it() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let whole = match sim_provider("anthropic", &sim.base_url(), "healthy")
        .call(&ask("continue me"))
        .await
    {
        AttemptOutcome::Succeeded(s) => s.output,
        other => panic!("{other:?}"),
    };
    let prefix: String = whole.chars().take(20).collect();
    let mut request = ask("continue me");
    request
        .messages
        .push(Message::new(Role::Assistant, prefix.clone()));
    for kind in ["anthropic", "sim"] {
        let p = sim_provider(kind, &sim.base_url(), "healthy");
        let ((outcome, _), pieces) = streamed(p.as_ref(), &request).await;
        assert!(matches!(outcome, AttemptOutcome::Succeeded(_)), "{kind}");
        assert_eq!(format!("{prefix}{}", text(&pieces)), whole, "{kind}");
    }
    let refusing = sim_provider("sim", &sim.base_url(), "no_prefill");
    let ((outcome, _), _) = streamed(refusing.as_ref(), &request).await;
    assert!(matches!(outcome, AttemptOutcome::Failed(f) if f.kind == "bad_request"));
    sim.shutdown().await.unwrap();
}

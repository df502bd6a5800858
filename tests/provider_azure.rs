//! The Azure OpenAI adapter against a fake upstream speaking Azure's
//! published format: OpenAI's chat completions at a deployment's URL, with
//! Azure's error codes and content-filter results.
#![allow(clippy::unwrap_used)]

mod upstream;

use onejob::providers::stream::Chunk;
use onejob::providers::{build_provider, AttemptOutcome, Lookup, Provider};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use upstream::{json, json_with, request, run_rows_with, transport_rows, upstream, Expect, Row};

const AZURE: &str = "deployment = \"gpt-4o-prod\"\napi_version = \"2024-10-21\"\n";

const SUCCESS: &str = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"gpt-4o-2024-08-06",
 "prompt_filter_results":[{"prompt_index":0,"content_filter_results":{"hate":{"filtered":false,"severity":"safe"}}}],
 "choices":[{"index":0,"finish_reason":"stop","message":{"role":"assistant","content":"{\"a\":\"x\"}"},
   "content_filter_results":{"hate":{"filtered":false,"severity":"safe"},"violence":{"filtered":false,"severity":"safe"}}}],
 "usage":{"prompt_tokens":19,"completion_tokens":5,"total_tokens":24}}"#;

/// Azure's 400 for a prompt its filter blocks.
const FILTERED_400: &str = r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry.",
 "type":null,"param":"prompt","code":"content_filter","status":400,
 "innererror":{"code":"ResponsibleAIPolicyViolation","content_filter_result":{
   "hate":{"filtered":false,"severity":"safe"},"jailbreak":{"filtered":false,"detected":false},
   "self_harm":{"filtered":false,"severity":"safe"},"sexual":{"filtered":false,"severity":"safe"},
   "violence":{"filtered":true,"severity":"medium"}}}}}"#;

fn provider(base_url: &str, extra: &str) -> Arc<dyn Provider> {
    build_provider(
        "azure",
        &upstream::config("azure_openai", base_url, &format!("{AZURE}{extra}")),
    )
    .unwrap()
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
    let mut rows = vec![
        Row {
            name: "200 completion",
            reply: json(200, SUCCESS),
            expect: Expect::Succeeded {
                output: "{\"a\":\"x\"}",
            },
        },
        Row {
            name: "400 content_filter",
            reply: json(400, FILTERED_400),
            expect: definitive("content_policy"),
        },
        Row {
            name: "400 context_length_exceeded",
            reply: json(
                400,
                r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            ),
            expect: definitive("context_length_exceeded"),
        },
        Row {
            name: "404 DeploymentNotFound",
            reply: json(
                404,
                r#"{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist."}}"#,
            ),
            expect: definitive("not_found"),
        },
        Row {
            name: "401 bad key",
            reply: json(
                401,
                r#"{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint."}}"#,
            ),
            expect: definitive("unauthorized"),
        },
        Row {
            name: "429 with retry-after",
            reply: json_with(
                429,
                vec![("retry-after", "6")],
                r#"{"error":{"code":"429","message":"Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded token rate limit of your current pricing tier. Please retry after 6 seconds."}}"#,
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "rate_limited",
                retry_after: Some(Duration::from_secs(6)),
            },
        },
        Row {
            name: "500 InternalServerError",
            reply: json(
                500,
                r#"{"error":{"code":"InternalServerError","message":"The server had an error processing your request."}}"#,
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "server_error",
                retry_after: None,
            },
        },
        Row {
            name: "503 ServiceUnavailable",
            reply: json(
                503,
                r#"{"error":{"code":"ServiceUnavailable","message":"The service is temporarily unable to process your request."}}"#,
            ),
            expect: Expect::Failed {
                retryable: true,
                kind: "unavailable",
                retry_after: None,
            },
        },
        Row {
            name: "200 stopped by the content filter",
            reply: json(
                200,
                r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"finish_reason":"content_filter",
                  "message":{"role":"assistant","content":null},
                  "content_filter_results":{"sexual":{"filtered":true,"severity":"high"}}}]}"#,
            ),
            expect: definitive("content_policy"),
        },
    ];
    rows.extend(transport_rows());
    run_rows_with("azure_openai", AZURE, rows).await;
}

#[tokio::test]
async fn the_deployment_url_api_version_and_api_key_header_are_azures() {
    let up = upstream(json(200, SUCCESS)).await;
    let outcome = provider(&up.base_url, "").call(&request()).await;
    let AttemptOutcome::Succeeded(s) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(s.usage.unwrap().prompt_tokens, 19);
    let seen = &up.seen()[0];
    assert_eq!(
        seen.uri.path(),
        "/openai/deployments/gpt-4o-prod/chat/completions"
    );
    assert_eq!(seen.uri.query(), Some("api-version=2024-10-21"));
    assert_eq!(seen.headers["api-key"], upstream::KEY_VALUE);
    assert!(seen.headers.get("authorization").is_none());
    assert_eq!(seen.headers["idempotency-key"], "onejob-test-key");
    // OpenAI's body: system first, the schema as response_format.
    assert_eq!(
        seen.body["messages"][0],
        json!({"role": "system", "content": "Answer in JSON."})
    );
    assert_eq!(seen.body["response_format"]["type"], "json_schema");
    assert!(seen.body.get("store").is_none());
    // The token limit in OpenAI's current field: Azure's o-series
    // deployments refuse `max_tokens`.
    assert_eq!(seen.body["max_completion_tokens"], 64);
    assert!(seen.body.get("max_tokens").is_none(), "{}", seen.body);

    let up = upstream(json(200, SUCCESS)).await;
    let bearer = provider(&up.base_url, "azure_auth = \"bearer\"\n");
    assert!(matches!(
        bearer.call(&request()).await,
        AttemptOutcome::Succeeded(_)
    ));
    let seen = &up.seen()[0];
    assert_eq!(
        seen.headers["authorization"],
        format!("Bearer {}", upstream::KEY_VALUE)
    );
    assert!(seen.headers.get("api-key").is_none());
    assert!(matches!(bearer.lookup("k").await, Lookup::CannotTell(_)));
}

#[tokio::test]
async fn a_content_filter_keeps_the_categories_it_filtered() {
    let up = upstream(json(400, FILTERED_400)).await;
    let AttemptOutcome::Failed(f) = provider(&up.base_url, "").call(&request()).await else {
        panic!()
    };
    assert_eq!(f.status, Some(400));
    assert!(f.message.starts_with("content_filter: "), "{}", f.message);
    assert!(
        f.message.ends_with("[filtered: violence (medium)]"),
        "{}",
        f.message
    );

    let sse = concat!(
        "data: {\"choices\":[],\"prompt_filter_results\":[{\"prompt_index\":0,\"content_filter_results\":{}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Sure\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"content_filter\",",
        "\"content_filter_results\":{\"hate\":{\"filtered\":false,\"severity\":\"safe\"},\"self_harm\":{\"filtered\":true,\"severity\":\"high\"},",
        "\"protected_material_text\":{\"filtered\":false,\"detected\":true}}}]}\n\n",
        "data: [DONE]\n\n",
    );
    let up = upstream(json(200, sse)).await;
    let (tx, mut rx) = mpsc::unbounded_channel::<Chunk>();
    let (outcome, finish) = provider(&up.base_url, "").stream(&request(), &tx).await;
    drop(tx);
    let mut pieces = Vec::new();
    while let Ok(heard) = rx.try_recv() {
        pieces.extend(heard.piece().map(|d| d.content));
    }
    assert_eq!(pieces, vec!["Sure".to_string()]);
    assert!(finish.is_none());
    let AttemptOutcome::Failed(f) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(f.kind, "content_policy");
    assert!(
        f.message
            .ends_with("[filtered: protected_material_text, self_harm (high)]"),
        "{}",
        f.message
    );
    assert_eq!(up.seen()[0].body["stream"], true);
}

#[tokio::test]
async fn a_stream_is_read_as_openais() {
    let sse = concat!(
        "data: {\"choices\":[],\"prompt_filter_results\":[{\"prompt_index\":0,\"content_filter_results\":{}}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":2,\"total_tokens\":11}}\n\n",
        "data: [DONE]\n\n",
    );
    let up = upstream(json(200, sse)).await;
    let (tx, _rx) = mpsc::unbounded_channel::<Chunk>();
    let (outcome, finish) = provider(&up.base_url, "").stream(&request(), &tx).await;
    let AttemptOutcome::Succeeded(s) = outcome else {
        panic!("{outcome:?}")
    };
    assert_eq!(s.output, "Hello");
    assert_eq!(s.usage.unwrap().completion_tokens, 2);
    assert_eq!(finish.unwrap().finish_reason.name(), "stop");
    assert_eq!(
        up.seen()[0].uri.path(),
        "/openai/deployments/gpt-4o-prod/chat/completions"
    );
}

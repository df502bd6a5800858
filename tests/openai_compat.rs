//! `POST /v1/chat/completions`: OpenAI's shape, onejob's idempotency.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::{json, Value};

on_both_backends!(a_completion_is_one_job_however_often_it_is_sent);

async fn complete(
    world: &World,
    key: Option<&str>,
    body: &Value,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = world
        .client
        .post(format!("{}/v1/chat/completions", world.address))
        .bearer_auth(&world.key)
        .json(body);
    if let Some(k) = key {
        request = request.header("Idempotency-Key", k);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status().as_u16(), response.headers().clone());
    (status, headers, response.json().await.unwrap())
}

async fn a_completion_is_one_job_however_often_it_is_sent(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=30",
        },
        ProviderSpec {
            name: "refuser",
            model: "reject",
        },
    ];
    let world = start_world(backend, &providers, route("primary", &[]), |c| {
        c.routes.insert("refused".into(), route("refuser", &[]));
    })
    .await;
    let body = json!({
        "model": "default",
        "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
        "temperature": 0,
        "max_completion_tokens": 64,
        "user": "ignored-by-onejob"
    });
    let (status, headers, first) = complete(&world, Some("chat-1"), &body).await;
    assert_eq!(status, 200, "{first}");
    assert_eq!(first["object"], "chat.completion");
    assert_eq!(first["choices"][0]["message"]["role"], "assistant");
    let content = first["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!content.is_empty());
    assert!(
        first["usage"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{first}"
    );
    let job_id = headers["x-onejob-job-id"].to_str().unwrap().to_string();
    assert_eq!(first["id"], format!("chatcmpl-{job_id}"));

    let (status, headers, again) = complete(&world, Some("chat-1"), &body).await;
    assert_eq!(status, 200);
    assert_eq!(headers["idempotent-replayed"], "true");
    assert_eq!(
        again["choices"], first["choices"],
        "the same completion, not a second one"
    );
    assert_eq!(world.executions(&job_id, "primary"), 1);
    assert_eq!(world.store.count_jobs().await.unwrap(), 1);

    let (status, _, err) = complete(&world, None, &body).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (400, Some("missing_idempotency_key"))
    );
    let mut streaming = body.clone();
    streaming["stream"] = json!(true);
    let (status, _, err) = complete(&world, Some("chat-2"), &streaming).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (422, Some("invalid_request"))
    );
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("stream"));
    let mut other_route = body.clone();
    other_route["model"] = json!("gpt-nonexistent");
    let (status, _, err) = complete(&world, Some("chat-3"), &other_route).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (422, Some("invalid_request"))
    );
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        1,
        "refused requests wrote nothing"
    );

    let mut refused = body.clone();
    refused["model"] = json!("refused");
    let (status, headers, err) = complete(&world, Some("chat-4"), &refused).await;
    assert_eq!(
        (status, err["error"]["code"].as_str()),
        (502, Some("job_not_completed")),
        "{err}"
    );
    assert_eq!(headers["x-should-retry"], "false");
    world.stop().await;
}

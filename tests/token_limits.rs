//! A job's token limit reaches the provider only when the client asked for
//! one, in the field the provider's wire takes: `max_completion_tokens` on
//! OpenAI's (its reasoning models refuse `max_tokens`), `max_tokens` where
//! a provider file says its server knows no other, and on Anthropic's,
//! which requires one, the file's `default_max_tokens` when the job has
//! none. A job without a limit needs room in a provider's window for its
//! prompt only.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
mod upstream;

use common::world::{route, set_window, start_world, ProviderSpec, World};
use common::Backend;
use serde_json::{json, Value};

on_both_backends!(
    an_openai_provider_gets_max_completion_tokens_and_nothing_when_none_is_asked,
    an_anthropic_provider_gets_its_files_default_when_the_job_sets_no_limit,
    a_job_without_a_limit_fits_a_window_its_prompt_fits,
);

const COMPLETION: &str = r#"{"id":"chatcmpl-up","object":"chat.completion","created":1,"model":"gpt-test",
 "choices":[{"index":0,"message":{"role":"assistant","content":"Hi."},"finish_reason":"stop"}],
 "usage":{"prompt_tokens":9,"completion_tokens":2,"total_tokens":11}}"#;

const MESSAGE: &str = r#"{"id":"msg_up","type":"message","role":"assistant","model":"claude-test",
 "content":[{"type":"text","text":"Hi."}],"stop_reason":"end_turn","stop_sequence":null,
 "usage":{"input_tokens":9,"output_tokens":2}}"#;

/// A world whose route `up` is one provider of `kind` on a fake upstream
/// answering `answer`, its file with `extra` lines.
async fn world_on(
    backend: Backend,
    kind: &'static str,
    extra: &'static str,
    answer: &str,
) -> (World, upstream::Upstream) {
    let up = upstream::upstream(upstream::json(200, answer)).await;
    let base_url = up.base_url.clone();
    let world = start_world(
        backend,
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        route("primary", &[]),
        move |c| {
            std::env::set_var(upstream::KEY_ENV, upstream::KEY_VALUE);
            let text = format!(
                "kind = \"{kind}\"\nbase_url = \"{base_url}\"\nmodel = \"m-test\"\n\
                 api_key_env = \"{}\"\ntokenizer = \"o200k_base\"\ncontext_window = 16384\n{extra}\n",
                upstream::KEY_ENV
            );
            std::fs::write(c.providers_dir.join("up.toml"), text).unwrap();
            c.routes.insert("up".into(), route("up", &[]));
        },
    )
    .await;
    (world, up)
}

async fn chat(world: &World, key: &str, body: &Value) -> (u16, Value) {
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

fn ask(model: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": "Say hi."}]})
}

/// The token-limit fields of each body the upstream received.
fn limits(up: &upstream::Upstream) -> Vec<(Value, Value)> {
    up.seen()
        .iter()
        .map(|s| {
            (
                s.body.get("max_tokens").cloned().unwrap_or(Value::Null),
                s.body
                    .get("max_completion_tokens")
                    .cloned()
                    .unwrap_or(Value::Null),
            )
        })
        .collect()
}

async fn an_openai_provider_gets_max_completion_tokens_and_nothing_when_none_is_asked(
    backend: Backend,
) {
    let (world, up) = world_on(backend, "openai", "", COMPLETION).await;
    let mut limited = ask("up");
    limited["max_completion_tokens"] = json!(500);
    assert_eq!(chat(&world, "o-1", &limited).await.0, 200);
    let mut legacy = ask("up");
    legacy["max_tokens"] = json!(300);
    assert_eq!(chat(&world, "o-2", &legacy).await.0, 200);
    assert_eq!(chat(&world, "o-3", &ask("up")).await.0, 200);
    assert_eq!(
        limits(&up),
        vec![
            (Value::Null, json!(500)),
            (Value::Null, json!(300)),
            (Value::Null, Value::Null),
        ]
    );
    world.stop().await;

    // A server that knows only `max_tokens`, as its file says.
    let (world, up) = world_on(
        backend,
        "openai",
        "max_tokens_field = \"max_tokens\"",
        COMPLETION,
    )
    .await;
    assert_eq!(chat(&world, "c-1", &limited).await.0, 200);
    assert_eq!(chat(&world, "c-2", &ask("up")).await.0, 200);
    assert_eq!(
        limits(&up),
        vec![(json!(500), Value::Null), (Value::Null, Value::Null)]
    );
    world.stop().await;
}

async fn an_anthropic_provider_gets_its_files_default_when_the_job_sets_no_limit(backend: Backend) {
    let (world, up) = world_on(backend, "anthropic", "default_max_tokens = 2048", MESSAGE).await;
    assert_eq!(chat(&world, "a-1", &ask("up")).await.0, 200);
    let mut limited = ask("up");
    limited["max_tokens"] = json!(100);
    assert_eq!(chat(&world, "a-2", &limited).await.0, 200);
    assert_eq!(
        limits(&up),
        vec![(json!(2048), Value::Null), (json!(100), Value::Null)]
    );
    world.stop().await;
}

async fn a_job_without_a_limit_fits_a_window_its_prompt_fits(backend: Backend) {
    let world = start_world(
        backend,
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        route("primary", &[]),
        |c| set_window(c, "primary", 512),
    )
    .await;
    let (status, body) = chat(&world, "w-1", &ask("default")).await;
    assert_eq!(status, 200, "{body}");
    // A limit the window cannot hold with the prompt still fails first.
    let mut limited = ask("default");
    limited["max_tokens"] = json!(1000);
    let (status, body) = chat(&world, "w-2", &limited).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    world.stop().await;
}

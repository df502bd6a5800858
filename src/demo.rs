//! `onejob demo`: a server on a temporary SQLite file, driven over real HTTP,
//! printing what a user would see.

use crate::app::Application;
use crate::clock::SystemClock;
use crate::config::{Config, Overrides};
use anyhow::Context;
use serde_json::{json, Value};

pub async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let db_path = dir.path().join("onejob.db");
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".to_string()),
        database_url: Some(db_path.display().to_string()),
    };
    let config = Config::load(None, &overrides)?;
    let app = Application::build(config).await?;
    let store = app.store();
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let key = crate::keys::create_key(store.as_ref(), &SystemClock, "demo", false).await?;
    println!(
        "onejob demo: server at {base}, database {}",
        db_path.display()
    );

    let client = reqwest::Client::new();
    let body = json!({ "messages": [{ "role": "user", "content": "Summarise order 42" }], "params": { "temperature": 0 } });

    println!("\n1. Double click: 10 identical POST /v1/jobs at once, Idempotency-Key: order-42");
    let mut calls = Vec::new();
    for _ in 0..10 {
        let request = client
            .post(format!("{base}/v1/jobs"))
            .bearer_auth(&key)
            .header("Idempotency-Key", "order-42")
            .json(&body);
        calls.push(tokio::spawn(request.send()));
    }
    let mut statuses = Vec::new();
    let mut job = Value::Null;
    for call in calls {
        let response = call.await??;
        statuses.push(response.status().as_u16());
        job = response.json().await?;
    }
    statuses.sort_unstable();
    println!("   statuses: {statuses:?}");
    println!(
        "   job {} state={} version={}",
        job["id"], job["state"], job["version"]
    );
    println!("   jobs in the database: {}", store.count_jobs().await?);

    println!("\n2. Same key, another payload");
    let other = json!({ "messages": [{ "role": "user", "content": "Summarise order 43" }] });
    let response = client
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "order-42")
        .json(&other)
        .send()
        .await?;
    let status = response.status().as_u16();
    let answer: Value = response.json().await?;
    println!("   {status} {}", answer["error"]["code"]);
    println!("   jobs in the database: {}", store.count_jobs().await?);

    let _ = stop.send(());
    server.await??;
    Ok(())
}

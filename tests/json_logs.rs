//! JSON log lines as a log pipeline reads them: a real `onejob serve`
//! process with `log_format = "json"` runs a hedged job against the
//! simulator, and every line of its stderr is parsed. Every line written
//! inside the job's work carries `job_id` as a top-level field, and every
//! line inside an attempt also `attempt_id` and `provider`, the ones of an
//! attempt the job really made; a streamed job's attempts as well.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::ServeConfig;
use common::world::{provider_dir, ProviderSpec};
use common::{chat_body, Backend, TestDb};
use onejob::clock::SystemClock;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_json_line_of_a_jobs_work_carries_its_ids_at_the_top_level() {
    let sim = onejob::sim::SimServer::start("127.0.0.1:0").await.unwrap();
    let providers = provider_dir(
        &[
            ProviderSpec {
                name: "slow",
                model: "healthy:latency=600",
            },
            ProviderSpec {
                name: "quick",
                model: "healthy:latency=30",
            },
        ],
        &sim.base_url(),
    );
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let config = ServeConfig {
        providers_dir: providers.path(),
        primary: "slow",
        fallbacks: &["quick"],
        silence_ms: 150,
        attempt_timeout_ms: 5_000,
        max_attempts: 2,
        max_concurrent_jobs: None,
        lease_margin_ms: None,
    }
    .write(dir.path());
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str("\n[telemetry]\nlog_format = \"json\"\n");
    std::fs::write(&config, text).unwrap();

    let log = dir.path().join("serve.log");
    let url = db.url_string();
    let mut child = Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["serve", "--listen", "127.0.0.1:0", "--database-url", &url])
        .args(["--config", &config.display().to_string()])
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env("RUST_LOG", "debug")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix("onejob listening on ")
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));

    let client = reqwest::Client::new();
    let response = client
        .post(format!("{address}/v1/jobs"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "json-logs-1")
        .json(&chat_body("log me"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let job: Value = response.json().await.unwrap();
    let id = job["id"].as_str().unwrap().to_string();
    // Both attempts ended (the slow one is discarded after the hedge wins).
    let deadline = Instant::now() + Duration::from_secs(15);
    let attempts = loop {
        let body: Value = client
            .get(format!("{address}/v1/jobs/{id}/attempts"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let attempts = body["attempts"].as_array().cloned().unwrap_or_default();
        if attempts.len() == 2 && attempts.iter().all(|a| a["state"] != "started") {
            break attempts;
        }
        assert!(Instant::now() < deadline, "attempts: {attempts:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A streamed job: its attempts run in tasks of their own, which must
    // carry the ids too (the slow primary is hedged, the hedge streams).
    let streamed = client
        .post(format!("{address}/v1/chat/completions"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "json-logs-stream-1")
        .json(&serde_json::json!({
            "model": "default",
            "messages": [{"role": "user", "content": "stream me"}],
            "stream": true
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), 200);
    let stream_id = streamed.headers()["x-onejob-job-id"]
        .to_str()
        .unwrap()
        .to_string();
    let events = streamed.text().await.unwrap();
    assert!(events.contains("data: [DONE]"), "{events}");
    let deadline = Instant::now() + Duration::from_secs(15);
    let stream_attempts = loop {
        let body: Value = client
            .get(format!("{address}/v1/jobs/{stream_id}/attempts"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let attempts = body["attempts"].as_array().cloned().unwrap_or_default();
        if attempts.len() == 2 && attempts.iter().all(|a| a["state"] != "started") {
            break attempts;
        }
        assert!(Instant::now() < deadline, "attempts: {attempts:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Refused requests: the same key with another body, and a bad key.
    let reused = client
        .post(format!("{address}/v1/jobs"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "json-logs-1")
        .json(&chat_body("another intent"))
        .send()
        .await
        .unwrap();
    assert_eq!(reused.status(), 409);
    let stranger = client
        .get(format!("{address}/v1/jobs/{id}"))
        .bearer_auth("ok_not_a_real_key")
        .send()
        .await
        .unwrap();
    assert_eq!(stranger.status(), 401);
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();

    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty());
    let in_span = |l: &Value, name: &str| {
        l["spans"]
            .as_array()
            .is_some_and(|s| s.iter().any(|s| s == name))
    };
    let (mut job_lines, mut attempt_lines, mut streamed_lines) = (0, 0, 0);
    for l in &lines {
        for field in ["timestamp", "level", "target"] {
            assert!(l[field].is_string(), "no {field}: {l}");
        }
        if in_span(l, "job") {
            assert!(
                l["job_id"].is_string(),
                "a line of a job's work without job_id: {l}"
            );
            if l["job_id"] == id.as_str() {
                job_lines += 1;
            }
        }
        if in_span(l, "attempt") {
            let (job, attempt) = [(&id, &attempts), (&stream_id, &stream_attempts)]
                .into_iter()
                .find_map(|(job, list)| {
                    list.iter()
                        .find(|a| a["id"] == l["attempt_id"])
                        .map(|a| (job, a))
                })
                .unwrap_or_else(|| panic!("a line of an attempt without its attempt_id: {l}"));
            assert_eq!(l["provider"], attempt["provider"], "{l}");
            assert_eq!(l["job_id"], job.as_str(), "{l}");
            if job == &stream_id {
                streamed_lines += 1;
            } else {
                attempt_lines += 1;
            }
        }
    }
    assert!(job_lines > 0, "no line of the job's work: {text}");
    // Each refusal is one line an operator can read, never with the key.
    let refused: Vec<&Value> = lines
        .iter()
        .filter(|l| l["message"] == "request refused")
        .collect();
    assert_eq!(refused.len(), 2, "{text}");
    assert_eq!(refused[0]["status"], 409, "{}", refused[0]);
    assert_eq!(refused[0]["code"], "idempotency_key_reused");
    assert_eq!(refused[0]["owner"], "alice");
    assert_eq!(refused[0]["path"], "/v1/jobs");
    assert_eq!(refused[0]["route"], "default");
    assert_eq!(refused[1]["status"], 401, "{}", refused[1]);
    assert_eq!(refused[1]["code"], "unauthorized");
    assert_eq!(refused[1]["owner"], "-");
    assert_eq!(refused[1]["route"], "-");
    assert!(!text.contains(key.as_str()), "the key is never logged");
    assert!(!text.contains("ok_not_a_real_key"));
    assert!(attempt_lines > 0, "no line of an attempt: {text}");
    assert!(
        streamed_lines > 0,
        "no line of a streamed attempt with its ids: {text}"
    );
    sim.shutdown().await.unwrap();
}

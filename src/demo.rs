//! `onejob demo`: the simulator and a server (with its engine) on a temporary
//! SQLite file, driven over real HTTP through the seed article's four
//! breakpoints and the lost response, printing each job's timeline.

use crate::app::Application;
use crate::clock::SystemClock;
use crate::config::{Config, Overrides, RouteConfig};
use crate::domain::JobId;
use crate::sim::{SimHandle, SimServer};
use crate::store::Store;
use anyhow::Context;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;

struct Demo {
    base: String,
    key: String,
    /// For `GET /v1/admin/routes/{name}/hedging`.
    admin_key: String,
    client: reqwest::Client,
    store: Arc<dyn Store>,
    sim: SimHandle,
}

fn route(
    primary: &str,
    fallbacks: &[&str],
    max_hedges: u32,
    attempt_timeout_ms: u64,
) -> RouteConfig {
    RouteConfig {
        primary: primary.to_string(),
        fallbacks: fallbacks.iter().map(|f| f.to_string()).collect(),
        silence_ms: 300,
        attempt_timeout_ms,
        max_hedges,
        max_attempts: 3,
        same_provider_retries: 1,
        backoff_base_ms: 50,
        backoff_cap_ms: 200,
        unknown_deadline_ms: 60_000,
        stall_ms: 2_000,
        ..RouteConfig::builtin_default()
    }
}

/// The demo's providers do not honour idempotency keys, so the timeout and
/// the lost response show the reconciler settling an unknown attempt (a
/// provider that honours keys is simply retried with the same key).
fn provider_file(base_url: &str, model: &str) -> String {
    format!(
        "kind = \"sim\"\nbase_url = \"{base_url}\"\nmodel = \"{model}\"\ntokenizer = \"o200k_base\"\n\
         context_window = 16384\nhonours_idempotency_key = false\nlookup = \"sim_ledger\"\n"
    )
}

pub async fn run() -> anyhow::Result<()> {
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let sim = SimServer::start("127.0.0.1:0").await?;
    let providers = dir.path().join("providers");
    std::fs::create_dir_all(&providers)?;
    std::fs::write(
        providers.join("primary.toml"),
        provider_file(&sim.base_url(), "demo-primary"),
    )?;
    std::fs::write(
        providers.join("fallback.toml"),
        provider_file(&sim.base_url(), "demo-fallback"),
    )?;
    let db_path = dir.path().join("onejob.db");
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".to_string()),
        database_url: Some(db_path.display().to_string()),
    };
    let mut config = Config::load(None, &overrides)?;
    config.providers_dir = providers;
    config.routes.clear();
    config
        .routes
        .insert("default".into(), route("primary", &["fallback"], 1, 3_000));
    config
        .routes
        .insert("solo".into(), route("primary", &[], 0, 800));
    let mut learned = route("primary", &["fallback"], 1, 3_000);
    learned.silence = crate::config::SilenceMode::Auto;
    learned.silence_ms = 2_000;
    learned.silence_min_ms = Some(20);
    learned.hedge_budget_percent = Some(10.0);
    config.routes.insert("learned".into(), learned);
    config.engine.poll_interval_ms = 20;
    config.engine.reconcile_interval_ms = 100;
    // Old enough to ask about: after the demo has shown the unknown state.
    config.engine.reconcile_min_age_ms = 1_000;
    config.engine.loser_grace_ms = 3_000;
    let app = Application::build(config).await?;
    let store = app.store();
    let base = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let key = crate::keys::create_key(store.as_ref(), &SystemClock, "demo", false).await?;
    let admin_key = crate::keys::create_key(store.as_ref(), &SystemClock, "demo-ops", true).await?;
    println!(
        "onejob demo: simulator at {}, server at {base}, SQLite {}",
        sim.base_url(),
        db_path.display()
    );
    println!("providers: primary and fallback, both on the simulator");
    println!("routes: default = primary, hedge to fallback after 300 ms of silence, attempts time out after 3 s;");
    println!("        solo = primary only, attempts time out after 800 ms;");
    println!("        learned = silence \"auto\": hedge after the primary's learned p95 (fixed 2000 ms until 30 samples)");
    let demo = Demo {
        base,
        key,
        admin_key,
        client: reqwest::Client::new(),
        store,
        sim,
    };

    demo.double_click().await?;
    demo.mismatched_payload().await?;
    demo.timeout_is_unknown().await?;
    demo.reverse_order().await?;
    demo.lost_response().await?;
    demo.learned_threshold().await?;

    let _ = stop.send(());
    server.await??;
    println!("\nDone. The database was temporary; `onejob serve` with `onejob sim` runs the same on onejob.db.");
    Ok(())
}

impl Demo {
    fn bind(&self, primary: &str, fallback: &str) -> anyhow::Result<()> {
        self.sim
            .models()
            .set("demo-primary", primary)
            .map_err(anyhow::Error::msg)?;
        self.sim
            .models()
            .set("demo-fallback", fallback)
            .map_err(anyhow::Error::msg)?;
        Ok(())
    }

    async fn submit(
        &self,
        key: &str,
        text: &str,
        route: &str,
        wait: u64,
    ) -> anyhow::Result<(u16, Value)> {
        let body = json!({ "messages": [{ "role": "user", "content": text }], "params": { "temperature": 0 }, "route": route });
        let response = self
            .client
            .post(format!("{}/v1/jobs", self.base))
            .bearer_auth(&self.key)
            .header("Idempotency-Key", key)
            .header("Prefer", format!("wait={wait}"))
            .json(&body)
            .send()
            .await?;
        Ok((response.status().as_u16(), response.json().await?))
    }

    async fn job(&self, id: &str, wait_for: &str) -> anyhow::Result<Value> {
        for _ in 0..200 {
            let job: Value = self
                .client
                .get(format!("{}/v1/jobs/{id}", self.base))
                .bearer_auth(&self.key)
                .send()
                .await?
                .json()
                .await?;
            if job["state"] == wait_for {
                return Ok(job);
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        anyhow::bail!("job {id} did not reach {wait_for}")
    }

    /// The job's event log as a timeline relative to its creation.
    async fn timeline(&self, job_id: &JobId) -> anyhow::Result<()> {
        let job = self.store.get_job(job_id).await?.context("job vanished")?;
        let attempts = self.store.list_attempts(job_id).await?;
        let label: HashMap<&str, String> = attempts
            .iter()
            .map(|a| {
                (
                    a.id.as_str(),
                    format!("#{} {} on {}", a.seq, a.kind.as_str(), a.provider),
                )
            })
            .collect();
        for e in self.store.list_events(job_id).await? {
            let what = e
                .attempt_id
                .as_deref()
                .and_then(|a| label.get(a))
                .cloned()
                .unwrap_or_default();
            let detail: Value = e
                .detail
                .as_deref()
                .and_then(|d| serde_json::from_str(d).ok())
                .unwrap_or(Value::Null);
            let line = match e.kind.as_str() {
                "created" => "job created (v0)".to_string(),
                "replayed" => continue,
                "attempt_started" => {
                    format!("attempt {what} started (read v{})", detail["read_version"])
                }
                "attempt_succeeded" => format!(
                    "attempt {what} answered and WON the compare-and-swap -> v{}",
                    detail["version"]
                ),
                "cas_lost" => format!(
                    "attempt {what} answered late: LOST the compare-and-swap, result discarded"
                ),
                "attempt_unknown" => format!(
                    "attempt {what} outcome UNKNOWN ({})",
                    detail["error_kind"].as_str().unwrap_or("")
                ),
                "attempt_failed" => format!(
                    "attempt {what} failed: {} ({})",
                    detail["error_kind"].as_str().unwrap_or(""),
                    e.actor
                ),
                "attempt_abandoned" => format!("attempt {what} abandoned after another won"),
                "blocked_on_unknown" => {
                    "job blocked: no retry while an attempt is unknown".to_string()
                }
                "retry_scheduled" => "retry scheduled (backoff)".to_string(),
                other => other.replace('_', " "),
            };
            println!("     {:>6} ms  {line}", e.at - job.created_at);
        }
        Ok(())
    }

    fn ledger(&self, job_id: &JobId, provider: &str) -> u64 {
        self.sim
            .ledger()
            .executions(&crate::providers::stable_key(job_id, provider))
    }

    async fn double_click(&self) -> anyhow::Result<()> {
        println!(
            "\n1. Double click: 10 identical POST /v1/jobs at once, Idempotency-Key: order-42"
        );
        self.bind("healthy:latency=50", "healthy")?;
        let mut calls = Vec::new();
        for _ in 0..10 {
            let request = self
                .client
                .post(format!("{}/v1/jobs", self.base))
                .bearer_auth(&self.key)
                .header("Idempotency-Key", "order-42")
                .header("Prefer", "wait=5")
                .json(
                    &json!({ "messages": [{ "role": "user", "content": "Summarise order 42" }] }),
                );
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
        let id = JobId::from(job["id"].as_str().unwrap_or_default());
        println!(
            "   answers: {statuses:?} -> one job {id}, state {}",
            job["state"]
        );
        self.timeline(&id).await?;
        println!(
            "   provider ledger: the key executed {} time(s)",
            self.ledger(&id, "primary")
        );
        Ok(())
    }

    async fn mismatched_payload(&self) -> anyhow::Result<()> {
        println!("\n2. Same key, another payload: Idempotency-Key order-42 with order 43's text");
        let (status, body) = self
            .submit("order-42", "Summarise order 43", "default", 0)
            .await?;
        println!(
            "   {status} {} ({})",
            body["error"]["code"],
            body["error"]["message"].as_str().unwrap_or("")
        );
        println!(
            "   jobs in the database: {}",
            self.store.count_jobs().await?
        );
        Ok(())
    }

    async fn timeout_is_unknown(&self) -> anyhow::Result<()> {
        println!("\n3. Timeout: the provider never answers (route solo, no fallback)");
        self.bind("hang", "healthy")?;
        let (_, job) = self
            .submit("order-44", "Summarise order 44", "solo", 3)
            .await?;
        let id = JobId::from(job["id"].as_str().unwrap_or_default());
        println!(
            "   after the timeout: state {}, blocked_on {}",
            job["state"], job["blocked_on"]
        );
        let retry = self
            .client
            .post(format!("{}/v1/jobs/{id}/retry", self.base))
            .bearer_auth(&self.key)
            .send()
            .await?;
        let status = retry.status().as_u16();
        let body: Value = retry.json().await?;
        println!("   POST /retry -> {status} {}", body["error"]["code"]);
        println!("   the provider recovers; the reconciler asks it by key: never executed -> a retry may run");
        self.bind("healthy:latency=30", "healthy")?;
        let job = self.job(&id, "succeeded").await?;
        self.timeline(&id).await?;
        println!(
            "   final: {} v{}; provider ledger: executed {} time(s)",
            job["state"],
            job["version"],
            self.ledger(&id, "primary")
        );
        Ok(())
    }

    async fn reverse_order(&self) -> anyhow::Result<()> {
        println!("\n4. Reverse-order finish: primary answers after 1.2 s, the hedge to the fallback after 0.1 s");
        self.bind("healthy:latency=1200", "healthy:latency=100")?;
        let (_, job) = self
            .submit("order-45", "Summarise order 45", "default", 5)
            .await?;
        let id = JobId::from(job["id"].as_str().unwrap_or_default());
        // Let the primary's late answer arrive and lose.
        for _ in 0..100 {
            let attempts = self.store.list_attempts(&id).await?;
            if attempts.iter().all(|a| !a.state.is_live()) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        self.timeline(&id).await?;
        println!(
            "   provider ledger: primary executed {}, fallback executed {}; the job kept the fallback's result",
            self.ledger(&id, "primary"),
            self.ledger(&id, "fallback")
        );
        Ok(())
    }

    async fn learned_threshold(&self) -> anyhow::Result<()> {
        println!("\n6. A learned threshold: 35 jobs teach route learned the primary's time to answer (40-80 ms)");
        self.bind("healthy:latency=40..80", "healthy:latency=40")?;
        for i in 0..35 {
            let text = format!("Summarise order {}", 100 + i);
            self.submit(&format!("warm-{i}"), &text, "learned", 5)
                .await?;
        }
        let hedging: Value = self
            .client
            .get(format!("{}/v1/admin/routes/learned/hedging", self.base))
            .bearer_auth(&self.admin_key)
            .send()
            .await?
            .json()
            .await?;
        let primary = &hedging["providers"][0];
        println!(
            "   GET /v1/admin/routes/learned/hedging: primary's silence in force {} ms, learned {} from {} samples (fixed silence_ms: {} ms)",
            primary["silence_ms_in_force"], primary["learned"], primary["samples"], hedging["silence_ms"]
        );
        println!("   now the primary takes 1.5 s; the fallback 40 ms");
        self.bind("healthy:latency=1500", "healthy:latency=40")?;
        let (_, job) = self
            .submit("order-47", "Summarise order 47", "learned", 5)
            .await?;
        let id = JobId::from(job["id"].as_str().unwrap_or_default());
        self.timeline(&id).await?;
        let attempts = self.store.list_attempts(&id).await?;
        let first = attempts.first().map_or(0, |a| a.started_at);
        let hedge = attempts
            .iter()
            .find(|a| a.kind == crate::domain::AttemptKind::Hedge);
        match hedge {
            Some(h) => println!(
                "   hedged at the learned threshold: {} ms after the primary started, not the fixed 2000 ms; state {}, answered by {}",
                h.started_at - first,
                job["state"],
                h.provider
            ),
            None => println!("   not hedged: state {}", job["state"]),
        }
        Ok(())
    }

    async fn lost_response(&self) -> anyhow::Result<()> {
        println!("\n5. The lost response: the provider executes, then the connection drops before it answers");
        self.bind("drop_response", "healthy")?;
        let (_, job) = self
            .submit("order-46", "Summarise order 46", "solo", 5)
            .await?;
        let id = JobId::from(job["id"].as_str().unwrap_or_default());
        let job = self.job(&id, "succeeded").await?;
        self.timeline(&id).await?;
        println!(
            "   final: {} with the recorded answer; provider ledger: executed {} time(s) (no second charge)",
            job["state"],
            self.ledger(&id, "primary")
        );
        Ok(())
    }
}

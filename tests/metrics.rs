//! `/metrics` is Prometheus text a real parser reads, and its counters and
//! histograms move as jobs run (a hedged job through the real server and the
//! simulator on a real socket).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, start_world, ProviderSpec, World};
use common::{chat_body, Backend};
use std::time::Duration;

on_both_backends!(metrics_parse_and_move_as_a_hedged_job_runs);
on_both_backends!(store_commits_count_a_jobs_two_writes);

const WAIT: Duration = Duration::from_secs(10);

/// The scrape, parsed by `prometheus-parse`.
async fn scrape(world: &World) -> prometheus_parse::Scrape {
    let response = world
        .client
        .get(format!("{}/metrics", world.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    let text = response.text().await.unwrap();
    let lines = text.lines().map(|l| Ok(l.to_string()));
    prometheus_parse::Scrape::parse(lines).expect("the text parses as Prometheus text")
}

/// The value of `name` with all of `labels`, summing the matching samples.
fn value(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == name)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            prometheus_parse::Value::Counter(v)
            | prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v) => *v,
            prometheus_parse::Value::Histogram(buckets) => {
                buckets.last().map(|b| b.count).unwrap_or(0.0)
            }
            other => panic!("unexpected sample {other:?}"),
        })
        .sum()
}

fn histogram_count(scrape: &prometheus_parse::Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    // prometheus-parse folds `_bucket`s into one Histogram sample whose
    // `+Inf` bucket is the count; `_count` is read as its own sample too.
    let count = value(scrape, &format!("{name}_count"), labels);
    let inf = value(scrape, name, labels);
    assert!(
        count == inf || count == 0.0 || inf == 0.0,
        "{name}: _count {count} vs +Inf {inf}"
    );
    count.max(inf)
}

async fn metrics_parse_and_move_as_a_hedged_job_runs(backend: Backend) {
    let providers = [
        ProviderSpec {
            name: "slow",
            model: "healthy:latency=900",
        },
        ProviderSpec {
            name: "quick",
            model: "healthy:latency=50",
        },
    ];
    let mut r = route("slow", &["quick"]);
    r.silence_ms = 200;
    let world = start_world(backend, &providers, r, |c| c.engine.loser_grace_ms = 5_000).await;

    let before = scrape(&world).await;
    assert_eq!(value(&before, "onejob_jobs_created_total", &[]), 0.0);
    assert_eq!(
        histogram_count(&before, "onejob_job_duration_seconds", &[]),
        0.0
    );
    let types: Vec<_> = before.docs.keys().cloned().collect();
    assert!(
        types.iter().any(|n| n == "onejob_job_duration_seconds"),
        "{types:?}"
    );

    let (_, job) = world
        .submit("metrics-1", &chat_body("count me"), None)
        .await;
    let id = job["id"].as_str().unwrap().to_string();
    world
        .until(&id, WAIT, |_, a| {
            a.iter()
                .any(|a| a["kind"] == "hedge" && a["state"] == "succeeded")
                && a.iter()
                    .any(|a| a["kind"] == "primary" && a["state"] == "discarded")
        })
        .await;

    let after = scrape(&world).await;
    assert_eq!(value(&after, "onejob_jobs_created_total", &[]), 1.0);
    assert_eq!(value(&after, "onejob_jobs_succeeded_total", &[]), 1.0);
    assert_eq!(value(&after, "onejob_hedges_started_total", &[]), 1.0);
    assert_eq!(value(&after, "onejob_hedges_won_total", &[]), 1.0);
    assert_eq!(value(&after, "onejob_cas_lost_total", &[]), 1.0);
    assert_eq!(
        value(
            &after,
            "onejob_attempts_total",
            &[("provider", "quick"), ("outcome", "succeeded")]
        ),
        1.0
    );
    assert_eq!(
        value(
            &after,
            "onejob_attempts_total",
            &[("provider", "slow"), ("outcome", "discarded")]
        ),
        1.0
    );
    assert_eq!(
        histogram_count(&after, "onejob_job_duration_seconds", &[]),
        1.0
    );
    for provider in ["slow", "quick"] {
        assert_eq!(
            histogram_count(
                &after,
                "onejob_provider_latency_seconds",
                &[("provider", provider)]
            ),
            1.0,
            "{provider}"
        );
    }
    assert_eq!(
        histogram_count(
            &after,
            "onejob_time_to_first_token_seconds",
            &[("provider", "quick")]
        ),
        1.0
    );
    assert!(
        value(
            &after,
            "onejob_discarded_tokens_by_provider_total",
            &[("provider", "slow")]
        ) > 0.0,
        "the discarded primary's tokens are counted against it"
    );
    assert_eq!(value(&after, "onejob_review_queue_depth", &[]), 0.0);
    world.stop().await;
}

/// A durable job is two writes, its create and its win, each committed
/// before the job goes on: `/metrics` counts the store's group commits and
/// the writes they carried. On PostgreSQL the two are the shared create
/// and win statements, exactly one each for a lone job; on SQLite every
/// write commits through the writer, so another write of this process (a key's
/// last use, the instance's heartbeat) may share the window.
async fn store_commits_count_a_jobs_two_writes(backend: Backend) {
    let providers = [ProviderSpec {
        name: "quick",
        model: "healthy:latency=5",
    }];
    let world = start_world(backend, &providers, route("quick", &[]), |_| {}).await;
    let before = scrape(&world).await;
    let commits = |s: &prometheus_parse::Scrape| {
        (
            value(s, "onejob_store_commits_total", &[]),
            value(s, "onejob_store_commit_writes_total", &[]),
        )
    };
    let (status, job) = world
        .submit("commits-1", &chat_body("count my writes"), Some(10))
        .await;
    // Created (201), and answered once it succeeded (`Prefer: wait`).
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["state"], "succeeded", "{job}");
    let after = scrape(&world).await;
    let (c0, w0) = commits(&before);
    let (c1, w1) = commits(&after);
    let (commits, writes) = (c1 - c0, w1 - w0);
    match backend {
        Backend::Postgres => assert_eq!((commits, writes), (2.0, 2.0)),
        Backend::Sqlite => {
            assert!(writes >= 2.0, "{writes} writes");
            assert!(
                (1.0..=writes).contains(&commits),
                "{commits} commits for {writes} writes"
            );
        }
    }
    assert!(
        after.docs.contains_key("onejob_store_commits_total"),
        "{:?}",
        after.docs.keys()
    );
    world.stop().await;
}

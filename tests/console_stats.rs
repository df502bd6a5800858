//! The overview's numbers over a week, on both backends: jobs and attempts
//! written through the store's own paths (create, the guarded start, the
//! finish with its CAS) at times spread over seven days, then the window's
//! aggregates compared with what was written. Counts are exact whether they
//! come from the hourly rollup (migration 0007) or the attempts themselves;
//! latency percentiles are within one histogram bucket (10%) of the exact
//! nearest-rank value.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{create_job, start_attempt, Backend, TestDb};
use onejob::domain::attempt::{Success, Usage};
use onejob::domain::{AttemptId, AttemptKind};
use onejob::store::console::{histogram_percentile, WindowStats};
use onejob::store::{AttemptOutcome, FinishAttempt, FinishOutcome, Store};
use std::collections::BTreeMap;

on_both_backends!(the_overview_over_a_week_counts_every_attempt_once_and_its_latency,);

const HOUR: i64 = 3_600_000;
const USAGE: Usage = Usage::new(10, 5);

async fn finish(
    store: &dyn Store,
    attempt: &AttemptId,
    end: AttemptOutcome,
    at: i64,
) -> FinishOutcome {
    store
        .finish_attempt(FinishAttempt {
            attempt_id: attempt.clone(),
            outcome: end,
            at,
            actor: "engine".into(),
        })
        .await
        .unwrap()
}

fn succeeded() -> AttemptOutcome {
    AttemptOutcome::Succeeded(Success {
        usage: Some(USAGE),
        ..Success::text("\"ok\"")
    })
}

fn nearest_rank(mut v: Vec<i64>, p: f64) -> i64 {
    v.sort_unstable();
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// (provider, state) -> attempts, as the overview's attempts chart sums them.
fn by_provider_state(stats: &WindowStats) -> BTreeMap<(String, String), i64> {
    let mut out = BTreeMap::new();
    for t in &stats.attempts {
        *out.entry((t.provider.clone(), t.state.clone()))
            .or_insert(0) += t.attempts;
    }
    out
}

async fn the_overview_over_a_week_counts_every_attempt_once_and_its_latency(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    // A window that starts and ends inside an hour, so both partial hours
    // and the whole hours between are read.
    let to = 500 * HOUR + 17 * 60_000;
    let from = to - 7 * 24 * HOUR;
    let jobs = 168;
    let mut expected: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut count = |p: &str, s: &str| *expected.entry((p.into(), s.into())).or_insert(0) += 1;
    let mut latencies: BTreeMap<&str, Vec<i64>> = BTreeMap::new();
    let (mut hedges, mut hedge_wins, mut discarded_tokens) = (0, 0, 0);
    // One job before the window and one after it: not counted.
    for (i, created) in (0..jobs)
        .map(|i| {
            (
                i,
                from + 20 * 60_000 + i * (7 * 24 * HOUR - 40 * 60_000) / jobs,
            )
        })
        .chain([(jobs, from - HOUR), (jobs + 1, to + HOUR)])
    {
        let job = create_job(store.as_ref(), "alice", &format!("order-{i}"), created).await;
        let inside = (from..to).contains(&created);
        let primary = start_attempt(
            store.as_ref(),
            &job,
            "sim",
            AttemptKind::Primary,
            created + 5,
        )
        .await;
        match i % 6 {
            0 | 5 => {
                let ms = 100 + 13 * i;
                let won = finish(store.as_ref(), &primary, succeeded(), created + 5 + ms).await;
                assert!(matches!(won, FinishOutcome::Won { .. }));
                if inside {
                    count("sim", "succeeded");
                    latencies.entry("sim").or_default().push(ms);
                }
            }
            1 => {
                let end = AttemptOutcome::failed("server_error".into(), "boom");
                finish(store.as_ref(), &primary, end, created + 300).await;
                if inside {
                    count("sim", "failed");
                }
            }
            2 => {
                // The hedge wins; the primary's late answer is discarded, paid for.
                let hedge = start_attempt(
                    store.as_ref(),
                    &job,
                    "backup",
                    AttemptKind::Hedge,
                    created + 60,
                )
                .await;
                let ms = 20 + i;
                finish(store.as_ref(), &hedge, succeeded(), created + 60 + ms).await;
                let lost = finish(store.as_ref(), &primary, succeeded(), created + 900).await;
                assert_eq!(lost, FinishOutcome::Lost);
                if inside {
                    count("backup", "succeeded");
                    count("sim", "discarded");
                    latencies.entry("backup").or_default().push(ms);
                    hedges += 1;
                    hedge_wins += 1;
                    discarded_tokens += 15;
                }
            }
            3 => {
                let end = AttemptOutcome::unknown("timeout".into(), "no answer");
                finish(store.as_ref(), &primary, end, created + 30_000).await;
                if inside {
                    count("sim", "unknown");
                }
            }
            _ => {
                // Still started.
                if inside {
                    count("sim", "started");
                }
            }
        }
    }

    let stats = store.window_stats(from, to, 168 * 60_000).await.unwrap();
    assert_eq!(stats.jobs, jobs);
    assert_eq!(
        stats.jobs_by_column.iter().map(|(c, _, _)| *c).max(),
        Some(59),
        "a week in 60 columns"
    );
    let succeeded_jobs: i64 = stats
        .jobs_by_column
        .iter()
        .filter(|(_, s, _)| s == "succeeded")
        .map(|(_, _, n)| n)
        .sum();
    assert_eq!(succeeded_jobs, jobs / 6 * 3);
    assert_eq!(by_provider_state(&stats), expected);
    assert_eq!((stats.hedges(), stats.hedge_wins()), (hedges, hedge_wins));
    let tokens: i64 = stats.attempts.iter().map(|t| t.discarded_tokens).sum();
    assert_eq!(tokens, discarded_tokens);
    for (provider, exact) in latencies {
        let histogram: Vec<(i64, i64)> = stats
            .attempts
            .iter()
            .filter(|t| t.provider == provider && t.state == "succeeded")
            .map(|t| (t.latency_le, t.attempts))
            .collect();
        for p in [50.0, 99.0] {
            let want = nearest_rank(exact.clone(), p) as f64;
            let got = histogram_percentile(&histogram, p) as f64;
            assert!(
                (got - want).abs() <= want * 0.1,
                "{provider} p{p}: {got} from the histogram, {want} exact"
            );
        }
    }

    // The same attempts over a window of whole hours only, and over one
    // that holds no whole hour: still each counted once.
    let aligned = store
        .window_stats(from - from % HOUR, to - to % HOUR + HOUR, HOUR)
        .await
        .unwrap();
    assert_eq!(by_provider_state(&aligned), by_provider_state(&stats));
    let short = store
        .window_stats(to - 30 * 60_000, to, 60_000)
        .await
        .unwrap();
    let in_short: i64 = short.attempts.iter().map(|t| t.attempts).sum();
    assert!(in_short <= 2, "{short:?}");
}

//! Hedging that tunes itself, on real sockets (issue 21, must be true 4):
//! the official `openai` Python SDK streams through onejob from the
//! built-in simulator, whose primary has a heavy-tailed time to first
//! token (3% of prompts wait 3 s, the rest 20-60 ms) and whose
//! fallback is healthy. A route with `silence = "auto"` learns the
//! primary's p95 and hedges past it; the same traffic on the fixed 10 s
//! default waits the tail out. Skips loudly without `ONEJOB_TEST_PYTHON`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::python::python;
use common::world::{route, start_world, ProviderSpec, World};
use common::Backend;
use onejob::config::SilenceMode;
use serde_json::Value;

on_both_backends!(auto_silence_beats_the_fixed_default_at_p99_time_to_first_token);

/// The primary's time to first token: uniform 20..60 ms, and 3% of the
/// requests 3 s more. Its p95 is in the body (about 59 ms on an idle
/// machine; what the clients see on the fixed route is the yardstick).
const PRIMARY: &str = "healthy:latency=20..60,tail=3%:3000";
/// `PRIMARY`'s tail: its share of the requests, and how long it waits.
const TAIL_SHARE: f64 = 0.03;
const TAIL_MS: f64 = 3_000.0;
const FALLBACK: &str = "healthy:latency=20..40";

/// `python hedging_ttft.py MODEL N THREADS PREFIX`: what it printed.
async fn ttft(
    python: &std::path::Path,
    world: &World,
    model: &str,
    n: usize,
    prefix: &str,
) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/hedging_ttft.py");
    let output = tokio::process::Command::new(python)
        .arg(script)
        .args([model, &n.to_string(), "6", prefix])
        .env("ONEJOB_BASE_URL", &world.address)
        .env("ONEJOB_API_KEY", &world.key)
        .output()
        .await
        .unwrap();
    assert!(
        output.status.success(),
        "hedging_ttft.py failed: {}\n{}",
        String::from_utf8_lossy(&output.stderr),
        String::from_utf8_lossy(&output.stdout)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

fn quantile(values: &[f64], q: f64) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ttfts(seen: &Value) -> Vec<f64> {
    seen["ttft_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

async fn auto_silence_beats_the_fixed_default_at_p99_time_to_first_token(backend: Backend) {
    let Some(python) = python() else {
        return;
    };
    // Latency in real time: on a machine whose cores are shared by many
    // builds, the SDK's and the server's own CPU time (hundreds of ms per
    // request) can swamp the tens of ms measured. `.ci/run` sets it (cargo
    // test runs one test binary at a time); a plain `cargo test` skips.
    if std::env::var("ONEJOB_TEST_HEDGING_SDK").is_err() {
        eprintln!(
            "SKIPPED (hedging through the SDK): set ONEJOB_TEST_HEDGING_SDK=1 on a quiet machine"
        );
        return;
    }
    let providers = [
        ProviderSpec {
            name: "primary",
            model: PRIMARY,
        },
        ProviderSpec {
            name: "fallback",
            model: FALLBACK,
        },
    ];
    // "fixed": the default route, silence_ms = 10 s. "auto": the same
    // providers, the threshold learned (clamped to 20 ms..10 s), hedges at
    // most 10% of the route's jobs.
    let world = start_world(backend, &providers, route("primary", &["fallback"]), |c| {
        let mut auto = route("primary", &["fallback"]);
        auto.silence = SilenceMode::Auto;
        auto.silence_min_ms = Some(20);
        auto.hedge_budget_percent = Some(10.0);
        auto.hedge_window_ms = 600_000;
        c.routes.insert("auto".into(), auto);
        c.routes
            .insert("fixed".into(), route("primary", &["fallback"]));
    })
    .await;
    let started = std::time::Instant::now();
    // The auto route learns first (50 requests; 30 samples are needed) …
    let warmup = ttft(&python, &world, "auto", 50, "warmup").await;
    let (_, before) = world
        .get(&world.admin_key, "/v1/admin/routes/auto/hedging")
        .await;
    // … then the same traffic on both routes.
    let auto = ttft(&python, &world, "auto", 200, "auto").await;
    let fixed = ttft(&python, &world, "fixed", 200, "fixed").await;
    let real = started.elapsed();
    let (status, view) = world
        .get(&world.admin_key, "/v1/admin/routes/auto/hedging")
        .await;
    assert_eq!(status, 200, "{view}");

    let (auto_ms, fixed_ms) = (ttfts(&auto), ttfts(&fixed));
    let (p99_auto, p99_fixed) = (quantile(&auto_ms, 0.99), quantile(&fixed_ms, 0.99));
    // The primary's real p95, as the clients of the fixed route saw it
    // (nothing is hedged there under 10 s). Its tail is 3% of requests, so
    // the p95 lies in the other 97%: their (0.95 - 0.03) / 0.97 quantile.
    // Read off the 250 samples directly, the p95 would land in the tail
    // whenever chance put 5% of them there (about 1 run in 25 per backend:
    // it failed CI once, 13 tail answers of 250).
    let body: Vec<f64> = fixed_ms
        .iter()
        .copied()
        .filter(|ms| *ms < TAIL_MS / 2.0)
        .collect();
    let real_p95 = quantile(&body, (0.95 - TAIL_SHARE) / (1.0 - TAIL_SHARE));
    let primary = &view["providers"][0];
    let threshold = primary["silence_ms_in_force"].as_f64().unwrap();
    let cost = &view["cost"];
    println!(
        "{backend:?}: TTFT p50/p95/p99 ms — fixed 10 s: {:.0}/{:.0}/{:.0}; auto: {:.0}/{:.0}/{:.0}; \
         threshold {threshold} ms (learned {}, {} samples) vs the primary's real p95 {real_p95:.0} ms; \
         hedges {} of {} jobs ({:.1}%), won {}, denied {}; warm-up p99 {:.0} ms; {real:?} real",
        quantile(&fixed_ms, 0.5),
        quantile(&fixed_ms, 0.95),
        p99_fixed,
        quantile(&auto_ms, 0.5),
        quantile(&auto_ms, 0.95),
        p99_auto,
        primary["learned"],
        primary["samples"],
        cost["hedges"],
        cost["jobs"],
        100.0 * cost["hedge_rate"].as_f64().unwrap(),
        cost["hedges_won"],
        cost["hedges_denied"],
        quantile(&ttfts(&warmup), 0.99),
    );

    assert_eq!(
        before["providers"][0]["learned"], true,
        "learned after the warm-up: {before}"
    );
    assert_eq!(primary["provider"], "primary");
    assert_eq!(primary["measure"], "time_to_first_token");
    assert_eq!(primary["learned"], true, "{view}");
    assert!(
        p99_fixed >= 3.0 * p99_auto,
        "auto's p99 TTFT {p99_auto:.0} ms is not 3× better than the fixed default's {p99_fixed:.0} ms"
    );
    // Hedges within the budget, and they won where the primary was slow.
    let (hedges, jobs) = (
        cost["hedges"].as_u64().unwrap(),
        cost["jobs"].as_u64().unwrap(),
    );
    assert_eq!(jobs, 250, "{view}");
    assert!(
        hedges > 0 && hedges * 10 <= jobs,
        "{hedges} hedges for {jobs} jobs"
    );
    assert!(cost["hedges_won"].as_u64().unwrap() > 0, "{view}");
    let on_fallback = auto["providers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| *p == "fallback")
        .count();
    assert!(
        on_fallback > 0,
        "some auto streams were answered by the hedge"
    );
    assert!(
        fixed["providers"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p == "primary"),
        "the fixed route never hedged under 10 s"
    );
    // The threshold is near the primary's real p95 (as the clients see it:
    // that adds the SDK's own time to what the engine measures).
    assert!(
        threshold >= 0.4 * real_p95 && threshold <= 1.6 * real_p95,
        "threshold {threshold} ms, real p95 {real_p95:.0} ms"
    );
    // And /metrics says the same.
    let metrics = world.metrics().await;
    let gauge = metrics
        .lines()
        .find(|l| {
            l.starts_with("onejob_hedge_silence_ms{")
                && l.contains("route=\"auto\"")
                && l.contains("provider=\"primary\"")
                && l.contains("measure=\"time_to_first_token\"")
        })
        .unwrap_or_else(|| panic!("no threshold gauge in /metrics:\n{metrics}"));
    let value: f64 = gauge.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(
        (value - threshold).abs() <= threshold * 0.2,
        "{gauge} vs {threshold}"
    );
    world.stop().await;
}

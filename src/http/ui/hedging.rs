//! What the console shows of hedging: each provider's silence threshold in
//! force on every route it serves (learned or fixed), every configured
//! provider with its switch and breaker (idle ones too), and the cost of
//! hedging per route over its window. Read from the engine's hedging state
//! (`GET /v1/admin/routes/{name}/hedging` reads the same).

use super::breaker_text;
use crate::http::admin_providers::view;
use crate::http::AppState;
use serde::Serialize;

/// One provider's threshold on one route.
#[derive(Debug, Serialize)]
pub struct ThresholdRow {
    pub route: String,
    pub measure: &'static str,
    pub silence_ms: u64,
    pub learned: bool,
    pub samples: String,
}

/// The thresholds in force for `provider`, one per route it is on.
pub fn thresholds(state: &AppState, provider: &str) -> Vec<ThresholdRow> {
    let Some(engine) = state.engine.as_ref() else {
        return Vec::new();
    };
    state
        .config
        .routes
        .keys()
        .filter_map(|name| engine.hedging(name))
        .flat_map(|route| {
            route
                .providers
                .into_iter()
                .filter(|p| p.provider == provider)
                .map(move |p| ThresholdRow {
                    route: route.route.clone(),
                    measure: p.main.measure.as_str(),
                    silence_ms: p.main.silence_ms_in_force,
                    learned: p.main.learned,
                    samples: format!("{:.0}", p.main.samples),
                })
        })
        .collect()
}

/// A configured provider on the overview.
#[derive(Debug, Serialize)]
pub struct ProviderLine {
    pub name: String,
    pub enabled: bool,
    pub breaker: String,
    pub breaker_class: &'static str,
    pub thresholds: Vec<ThresholdRow>,
}

/// Every configured provider, whether or not it had work in the window.
pub fn providers(state: &AppState) -> Vec<ProviderLine> {
    let now = state.clock.now_ms();
    state
        .providers
        .names()
        .filter_map(|name| {
            let v = view(state, name).ok()?;
            let (breaker, breaker_class) = breaker_text(&v.breaker, now);
            Some(ProviderLine {
                name: v.name,
                enabled: v.enabled,
                breaker,
                breaker_class,
                thresholds: thresholds(state, name),
            })
        })
        .collect()
}

/// The cost of hedging on one route over its window.
#[derive(Debug, Serialize)]
pub struct RouteCost {
    pub route: String,
    pub silence: String,
    pub window: String,
    pub budget: String,
    pub jobs: u64,
    pub hedge_rate: String,
    pub hedge_win_rate: String,
    pub denied: u64,
    pub saved: String,
    pub discarded_tokens: u64,
}

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

pub fn route_costs(state: &AppState) -> Vec<RouteCost> {
    let Some(engine) = state.engine.as_ref() else {
        return Vec::new();
    };
    state
        .config
        .routes
        .keys()
        .filter_map(|name| engine.hedging(name))
        .map(|r| {
            let c = &r.cost;
            RouteCost {
                silence: match r.silence {
                    crate::config::SilenceMode::Auto => format!(
                        "auto (p{}, {}–{} ms)",
                        r.hedge_quantile * 100.0,
                        r.silence_min_ms,
                        r.silence_max_ms
                    ),
                    crate::config::SilenceMode::Fixed => format!("fixed {} ms", r.silence_ms),
                },
                window: super::timeline::span(r.window_ms),
                budget: r
                    .hedge_budget_percent
                    .map_or_else(|| "none".to_string(), |b| format!("{b}%")),
                jobs: c.jobs,
                hedge_rate: percent(c.hedge_rate),
                hedge_win_rate: percent(c.hedge_win_rate),
                denied: c.hedges_denied,
                saved: if c.latency_saved_samples == 0 {
                    "—".to_string()
                } else {
                    format!(
                        "{} ms in {} jobs",
                        c.latency_saved_ms, c.latency_saved_samples
                    )
                },
                discarded_tokens: c.discarded_tokens,
                route: r.route,
            }
        })
        .collect()
}

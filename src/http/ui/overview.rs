//! The overview: what happened in a chosen window, from the database (so
//! every replica draws the same picture): jobs per minute by outcome,
//! attempts by provider and outcome, p50/p99 latency per provider, hedge
//! rate and hedge win rate, tokens spent on discarded attempts (the cost of
//! hedging) and the review-queue depth, as small SVG charts.

use super::form::ConsoleQuery;
use super::session::UiAdmin;
use super::svg::{format_number, stacked_columns, stacked_rows, Series};
use super::{error_page, layout, render_page};
use crate::domain::Millis;
use crate::http::AppState;
use crate::store::console::{histogram_percentile, WindowStats};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The windows one can choose, by name, in minutes.
pub const WINDOWS: [(&str, i64); 5] = [
    ("15m", 15),
    ("1h", 60),
    ("6h", 360),
    ("24h", 1_440),
    ("7d", 10_080),
];

#[derive(Debug, Default, Deserialize)]
pub struct OverviewQuery {
    #[serde(default)]
    window: String,
}

const JOB_OUTCOMES: [(&str, &str); 5] = [
    ("succeeded", "#2e9d5b"),
    ("failed", "#d64545"),
    ("needs_review", "#e08a1e"),
    ("cancelled", "#7a7f8a"),
    ("in flight", "#3f7fd8"),
];

const ATTEMPT_OUTCOMES: [(&str, &str); 6] = [
    ("succeeded", "#2e9d5b"),
    ("failed", "#d64545"),
    ("unknown", "#e08a1e"),
    ("discarded", "#98a2b3"),
    ("cancelled", "#7a7f8a"),
    ("started", "#3f7fd8"),
];

fn series<'a>(table: &'a [(&'a str, &'a str)]) -> Vec<Series<'a>> {
    table
        .iter()
        .map(|(name, colour)| Series { name, colour })
        .collect()
}

#[derive(Serialize)]
struct LatencyRow {
    provider: String,
    n: usize,
    p50: i64,
    p99: i64,
}

/// The overview's charts and numbers for `[from, to)`.
pub struct Drawn {
    pub jobs_chart: String,
    pub attempts_chart: String,
    pub latency_chart: String,
    pub discarded_chart: String,
    latencies: Vec<LatencyRow>,
    pub hedge_rate: String,
    pub hedge_win_rate: String,
    pub discarded_tokens: u64,
}

/// Jobs per minute by outcome are drawn in at most 60 columns: how many
/// columns `[from, to)` gets and how wide each is.
pub fn columns_of(from: Millis, to: Millis) -> (usize, i64) {
    let minutes = ((to - from) / 60_000).max(1);
    let per_column = (minutes / 60).max(1);
    (
        ((minutes / per_column).max(1)) as usize,
        per_column * 60_000,
    )
}

pub fn draw(stats: &WindowStats, from: Millis, to: Millis) -> Drawn {
    let (columns_n, column_ms) = columns_of(from, to);
    let mut columns: Vec<(String, Vec<f64>)> = (0..columns_n)
        .map(|i| {
            let at = from + i as i64 * column_ms;
            let label = super::when(at).get(11..16).unwrap_or("").to_string();
            (label, vec![0.0; JOB_OUTCOMES.len()])
        })
        .collect();
    for (column, state, n) in &stats.jobs_by_column {
        let i = (*column.max(&0) as usize).min(columns_n - 1);
        let j = JOB_OUTCOMES
            .iter()
            .position(|(name, _)| name == state)
            .unwrap_or(JOB_OUTCOMES.len() - 1);
        columns[i].1[j] += *n as f64;
    }
    let jobs_chart = stacked_columns("chart-jobs", &columns, &series(&JOB_OUTCOMES));

    let mut by_provider: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for t in &stats.attempts {
        let row = by_provider
            .entry(&t.provider)
            .or_insert_with(|| vec![0.0; ATTEMPT_OUTCOMES.len()]);
        if let Some(j) = ATTEMPT_OUTCOMES
            .iter()
            .position(|(name, _)| *name == t.state)
        {
            row[j] += t.attempts as f64;
        }
    }
    let rows: Vec<(String, Vec<f64>)> = by_provider
        .into_iter()
        .map(|(p, v)| (p.to_string(), v))
        .collect();
    let attempts_chart = stacked_rows("chart-attempts", &rows, &series(&ATTEMPT_OUTCOMES), "");

    // Succeeded attempts' latency histograms, by provider.
    let mut histograms: BTreeMap<&str, Vec<(i64, i64)>> = BTreeMap::new();
    for t in stats.attempts.iter().filter(|t| t.state == "succeeded") {
        histograms
            .entry(&t.provider)
            .or_default()
            .push((t.latency_le, t.attempts));
    }
    let latencies: Vec<LatencyRow> = histograms
        .into_iter()
        .map(|(provider, histogram)| LatencyRow {
            provider: provider.to_string(),
            n: histogram.iter().map(|(_, n)| *n as usize).sum(),
            p50: histogram_percentile(&histogram, 50.0),
            p99: histogram_percentile(&histogram, 99.0),
        })
        .collect();
    let latency_rows: Vec<(String, Vec<f64>)> = latencies
        .iter()
        .map(|l| {
            (
                l.provider.clone(),
                vec![l.p50 as f64, (l.p99 - l.p50) as f64],
            )
        })
        .collect();
    let latency_chart = stacked_rows(
        "chart-latency",
        &latency_rows,
        &[
            Series {
                name: "p50",
                colour: "#3358d4",
            },
            Series {
                name: "p99",
                colour: "#9db2f0",
            },
        ],
        "ms",
    );

    let mut discarded: BTreeMap<&str, f64> = BTreeMap::new();
    for t in stats.attempts.iter().filter(|t| t.state == "discarded") {
        *discarded.entry(&t.provider).or_default() += t.discarded_tokens as f64;
    }
    let discarded_tokens = discarded.values().sum::<f64>() as u64;
    let discarded_rows: Vec<(String, Vec<f64>)> = discarded
        .into_iter()
        .map(|(p, n)| (p.to_string(), vec![n]))
        .collect();
    let discarded_chart = stacked_rows(
        "chart-discarded",
        &discarded_rows,
        &[Series {
            name: "tokens on discarded attempts",
            colour: "#98a2b3",
        }],
        "tok",
    );
    let ratio = |a: i64, b: i64| {
        if b == 0 {
            "—".to_string()
        } else {
            format!("{}%", format_number(a as f64 * 100.0 / b as f64))
        }
    };
    Drawn {
        jobs_chart,
        attempts_chart,
        latency_chart,
        discarded_chart,
        latencies,
        hedge_rate: ratio(stats.hedges(), stats.jobs),
        hedge_win_rate: ratio(stats.hedge_wins(), stats.hedges()),
        discarded_tokens,
    }
}

/// `GET /ui/overview?window=1h`
pub async fn page(
    State(state): State<AppState>,
    admin: UiAdmin,
    ConsoleQuery(query): ConsoleQuery<OverviewQuery>,
) -> Response {
    let (window, minutes) = WINDOWS
        .iter()
        .find(|(name, _)| *name == query.window)
        .copied()
        .unwrap_or(WINDOWS[1]);
    let to = state.clock.now_ms();
    // Whole minutes, so the columns line up with the clock.
    let to = (to / 60_000 + 1) * 60_000;
    let from = to - minutes * 60_000;
    let (_, column_ms) = columns_of(from, to);
    let stats = match state.store.window_stats(from, to, column_ms).await {
        Ok(s) => s,
        Err(e) => return error_page(e.into()),
    };
    let d = draw(&stats, from, to);
    let safe = minijinja::Value::from_safe_string;
    render_page(
        "overview.html",
        minijinja::context! {
            window => window,
            windows => WINDOWS.iter().map(|(n, _)| *n).collect::<Vec<_>>(),
            jobs => stats.jobs,
            hedges => stats.hedges(),
            hedge_wins => stats.hedge_wins(),
            hedge_rate => d.hedge_rate,
            hedge_win_rate => d.hedge_win_rate,
            review_depth => stats.review_depth,
            discarded_tokens => d.discarded_tokens,
            latencies => d.latencies,
            jobs_chart => safe(d.jobs_chart),
            attempts_chart => safe(d.attempts_chart),
            latency_chart => safe(d.latency_chart),
            discarded_chart => safe(d.discarded_chart),
            providers => super::hedging::providers(&state),
            route_costs => super::hedging::route_costs(&state),
            ..layout(&admin, "Overview", "overview")
        },
    )
    .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::console::AttemptTally;

    fn tally(
        provider: &str,
        kind: &str,
        state: &str,
        le: i64,
        n: i64,
        tokens: i64,
    ) -> AttemptTally {
        AttemptTally {
            provider: provider.into(),
            kind: kind.into(),
            state: state.into(),
            latency_le: le,
            attempts: n,
            discarded_tokens: tokens,
        }
    }

    #[test]
    fn hedge_rates_and_discarded_tokens_come_from_the_window() {
        let stats = WindowStats {
            jobs_by_column: vec![(1, "succeeded".into(), 4)],
            attempts: vec![
                tally("a", "primary", "discarded", 0, 1, 15),
                tally("b", "hedge", "succeeded", 100, 1, 0),
                tally("b", "hedge", "failed", 0, 1, 0),
            ],
            jobs: 4,
            review_depth: 0,
        };
        let d = draw(&stats, 0, 3_600_000);
        assert_eq!(
            (d.hedge_rate.as_str(), d.hedge_win_rate.as_str()),
            ("50%", "50%")
        );
        assert_eq!(d.discarded_tokens, 15);
        assert!(d.jobs_chart.contains("4 succeeded"), "{}", d.jobs_chart);
        assert_eq!((d.latencies[0].n, d.latencies[0].p99), (1, 100));
    }

    #[test]
    fn a_week_is_sixty_columns_of_168_minutes() {
        assert_eq!(columns_of(0, 7 * 24 * 3_600_000), (60, 168 * 60_000));
        assert_eq!(columns_of(0, 15 * 60_000), (15, 60_000));
    }
}

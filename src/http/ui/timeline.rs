//! A job's attempts on one time axis, drawn as SVG by the server: one bar
//! per attempt (primary, hedge, retries) from its start to its end, coloured
//! by how it ended; the route's silence threshold (when a hedge may start)
//! and each attempt's timeout marked; the winner of the compare-and-swap,
//! discarded and abandoned losers, and unknown attempts with how they were
//! settled, written beside their bars.

use super::svg::{esc, Svg};
use crate::domain::{Attempt, AttemptState, ErrorKind, EventKind, Job, Millis};
use crate::store::{event, JobEvent};

const WIDTH: f64 = 960.0;
const LABEL_W: f64 = 190.0;
const NOTE_W: f64 = 250.0;
const ROW_H: f64 = 34.0;
const TOP: f64 = 30.0;

/// How an attempt ended, as the timeline tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    /// CSS colour variable name and legend word.
    pub class: &'static str,
    pub label: String,
}

/// What an attempt's bar says: won, discarded, abandoned, unknown (and how
/// it was settled), failed, cancelled, or still running.
pub fn ending(job: &Job, attempt: &Attempt, events: &[JobEvent]) -> Ending {
    let mine = |kind: EventKind| {
        events
            .iter()
            .rev()
            .find(|e| e.attempt_id.as_deref() == Some(attempt.id.as_str()) && e.kind == kind)
    };
    let was_unknown = mine(event::ATTEMPT_UNKNOWN).is_some();
    let settled_by = mine(event::ATTEMPT_RESOLVED)
        .map(|e| format!("settled by {}", e.actor))
        .or_else(|| {
            (was_unknown && attempt.state != AttemptState::Unknown)
                .then(|| "settled by reconciliation".to_string())
        });
    let won = job.completed_by.as_deref() == Some(attempt.id.as_str());
    let (class, mut label) = match attempt.state {
        AttemptState::Succeeded if won => ("won", "won the CAS".to_string()),
        AttemptState::Succeeded => ("succeeded", "succeeded".to_string()),
        AttemptState::Discarded if attempt.error_kind == Some(ErrorKind::Abandoned) => {
            ("abandoned", "abandoned: another attempt won".to_string())
        }
        AttemptState::Discarded => ("discarded", "lost the CAS: discarded".to_string()),
        AttemptState::Unknown => ("unknown", "unknown: outcome not known".to_string()),
        AttemptState::Failed => (
            "failed",
            format!(
                "failed: {}",
                attempt
                    .error_kind
                    .as_ref()
                    .map_or("error", ErrorKind::as_str)
            ),
        ),
        AttemptState::Cancelled => ("cancelled", "cancelled".to_string()),
        AttemptState::Started => ("started", "in flight".to_string()),
    };
    if was_unknown {
        label = match settled_by {
            Some(how) => format!("was unknown; {how}: {label}"),
            None => label,
        };
    }
    Ending { class, label }
}

fn colour(class: &str) -> &'static str {
    match class {
        "won" | "succeeded" => "#2e9d5b",
        "discarded" => "#98a2b3",
        "abandoned" => "#c0c6d0",
        "unknown" => "#e08a1e",
        "failed" => "#d64545",
        "cancelled" => "#7a7f8a",
        _ => "#3f7fd8",
    }
}

/// A readable span of time: `850 ms`, `12.4 s`, `3.0 min`.
pub fn span(ms: i64) -> String {
    match ms {
        ms if ms < 1_000 => format!("{ms} ms"),
        ms if ms < 120_000 => format!("{:.1} s", ms as f64 / 1000.0),
        ms => format!("{:.1} min", ms as f64 / 60_000.0),
    }
}

/// The timeline of `job`; `now` ends the bars of attempts still in flight.
pub fn draw(
    job: &Job,
    attempts: &[Attempt],
    events: &[JobEvent],
    silence_ms: Option<u64>,
    attempt_timeout_ms: Option<u64>,
    now: Millis,
) -> String {
    let origin = job.created_at;
    let mut end = attempts
        .iter()
        .map(|a| a.finished_at.unwrap_or(now))
        .chain(std::iter::once(job.updated_at))
        .max()
        .unwrap_or(origin);
    if let (Some(first), Some(silence)) = (attempts.first(), silence_ms) {
        // Show the silence mark even for a job that finished before it.
        end = end.max(first.started_at + silence as i64);
    }
    let range = (end - origin).max(1) as f64 * 1.05;
    let plot_w = WIDTH - LABEL_W - NOTE_W;
    let x = |t: Millis| LABEL_W + ((t - origin) as f64 / range) * plot_w;
    let rows = attempts.len().max(1) as f64;
    let height = TOP + rows * ROW_H + 36.0;
    let mut svg = Svg::new(WIDTH, height, "job-timeline");
    svg.raw(&format!(
        "<title>Attempts of job {} on one time axis</title>",
        esc(&job.id)
    ));
    // The axis, with ticks at round intervals.
    let axis_y = TOP + rows * ROW_H + 6.0;
    svg.line(
        LABEL_W,
        axis_y,
        LABEL_W + plot_w,
        axis_y,
        "#667085",
        1.0,
        None,
    );
    let step = nice_step(range / 6.0);
    let mut t = 0.0;
    while t <= range {
        let px = LABEL_W + t / range * plot_w;
        svg.line(px, TOP - 6.0, px, axis_y + 4.0, "#e4e7ec", 1.0, None);
        svg.text(
            px,
            axis_y + 18.0,
            &span(t as i64),
            "middle",
            11.0,
            "#667085",
        );
        t += step;
    }
    if let (Some(first), Some(silence)) = (attempts.first(), silence_ms) {
        let px = x(first.started_at + silence as i64);
        svg.line(px, TOP - 10.0, px, axis_y, "#3358d4", 1.5, Some("5 4"));
        svg.raw(&format!(
            "<text class=\"silence-mark\" x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\" font-size=\"11\" fill=\"#3358d4\">silence threshold {}</text>",
            TOP - 14.0,
            esc(&span(silence as i64))
        ));
    }
    for (i, attempt) in attempts.iter().enumerate() {
        let y = TOP + i as f64 * ROW_H;
        let ending = ending(job, attempt, events);
        let x0 = x(attempt.started_at);
        let x1 = x(attempt.finished_at.unwrap_or(now)).max(x0 + 3.0);
        svg.text(
            LABEL_W - 8.0,
            y + 18.0,
            &format!(
                "#{} {} · {}",
                attempt.seq,
                attempt.kind.as_str(),
                attempt.provider
            ),
            "end",
            12.0,
            "#1d2330",
        );
        let open = attempt.finished_at.is_none();
        svg.raw(&format!(
            "<rect class=\"attempt {class}\" data-attempt=\"{id}\" data-kind=\"{kind}\" data-state=\"{state}\" x=\"{x0:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"18\" rx=\"3\" fill=\"{fill}\"{dash}><title>{tip}</title></rect>",
            y + 5.0,
            x1 - x0,
            class = ending.class,
            id = esc(&attempt.id),
            kind = attempt.kind.as_str(),
            state = attempt.state.as_str(),
            fill = colour(ending.class),
            dash = if open { " stroke=\"#1d2330\" stroke-dasharray=\"3 2\" fill-opacity=\"0.55\"" } else { "" },
            tip = esc(&format!(
                "{} {} on {}: {} after {}",
                attempt.kind.as_str(),
                attempt.id,
                attempt.provider,
                ending.label,
                span(attempt.finished_at.unwrap_or(now) - attempt.started_at)
            )),
        ));
        if let Some(timeout) = attempt_timeout_ms {
            let deadline = attempt.started_at + timeout as i64;
            if deadline <= end || attempt.error_kind == Some(ErrorKind::AttemptTimeout) {
                let px = x(deadline);
                svg.line(px, y + 1.0, px, y + 27.0, "#d64545", 2.0, Some("2 2"));
                svg.text(px + 3.0, y + 30.0, "timeout", "start", 9.0, "#d64545");
            }
        }
        svg.raw(&format!(
            "<text class=\"ending\" x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" fill=\"{}\">{}</text>",
            LABEL_W + plot_w + 10.0,
            y + 18.0,
            colour(ending.class),
            esc(&ending.label)
        ));
    }
    svg.finish()
}

/// A round step for about `raw` milliseconds (1, 2 or 5 × 10^n).
fn nice_step(raw: f64) -> f64 {
    let raw = raw.max(1.0);
    let magnitude = 10f64.powf(raw.log10().floor());
    let fraction = raw / magnitude;
    let nice = if fraction <= 1.0 {
        1.0
    } else if fraction <= 2.0 {
        2.0
    } else if fraction <= 5.0 {
        5.0
    } else {
        10.0
    };
    nice * magnitude
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::{AttemptKind, JobState};

    fn job() -> Job {
        Job {
            id: "j1".into(),
            owner_id: "o".into(),
            idempotency_key: "k".into(),
            fingerprint: "f".into(),
            request: "{}".into(),
            route: "default".into(),
            state: JobState::Succeeded,
            version: 1,
            result: Some("{}".into()),
            completed_by: Some("a2".into()),
            last_error: None,
            attempt_count: 2,
            created_at: 1_000,
            updated_at: 1_400,
            next_run_at: None,
            lease_owner: None,
            lease_until: None,
            budget_start: 0,
        }
    }

    fn attempt(
        id: &str,
        seq: i64,
        kind: AttemptKind,
        state: AttemptState,
        at: Millis,
        end: Millis,
    ) -> Attempt {
        Attempt {
            id: id.into(),
            job_id: "j1".into(),
            seq,
            provider: format!("p{seq}"),
            kind,
            state,
            read_version: 0,
            started_at: at,
            finished_at: Some(end),
            error_kind: None,
            error_message: None,
            output: None,
            usage: None,
            provider_request_id: None,
            finish_reason: None,
        }
    }

    #[test]
    fn a_hedged_job_shows_both_bars_the_winner_and_the_silence_mark() {
        let attempts = [
            attempt(
                "a1",
                1,
                AttemptKind::Primary,
                AttemptState::Discarded,
                1_000,
                2_000,
            ),
            attempt(
                "a2",
                2,
                AttemptKind::Hedge,
                AttemptState::Succeeded,
                1_200,
                1_300,
            ),
        ];
        let svg = draw(&job(), &attempts, &[], Some(200), Some(5_000), 2_000);
        assert_eq!(svg.matches("<rect class=\"attempt ").count(), 2, "{svg}");
        assert!(
            svg.contains("attempt won\" data-attempt=\"a2\" data-kind=\"hedge\""),
            "{svg}"
        );
        assert!(svg.contains("lost the CAS: discarded"), "{svg}");
        assert!(svg.contains("silence threshold 200 ms"), "{svg}");
    }

    #[test]
    fn a_settled_unknown_attempt_says_how() {
        let attempts = [attempt(
            "a1",
            1,
            AttemptKind::Primary,
            AttemptState::Cancelled,
            1_000,
            2_000,
        )];
        let events = [
            JobEvent {
                id: 1,
                job_id: "j1".into(),
                attempt_id: Some("a1".into()),
                kind: event::ATTEMPT_UNKNOWN,
                actor: "engine:x".into(),
                detail: None,
                at: 1_500,
            },
            JobEvent {
                id: 2,
                job_id: "j1".into(),
                attempt_id: Some("a1".into()),
                kind: event::ATTEMPT_RESOLVED,
                actor: "admin:ops".into(),
                detail: None,
                at: 1_900,
            },
        ];
        let e = ending(&job(), &attempts[0], &events);
        assert_eq!(e.label, "was unknown; settled by admin:ops: cancelled");
    }
}

//! Usage as owners and admins read it: tokens and jobs by day, route and
//! provider, with what hedging and lost races cost shown apart.

use crate::clock::Clock;
use crate::domain::OwnerId;
use crate::store::tenants::{day_of, UsageRow, MS_PER_DAY};
use crate::store::{Store, StoreError};
use serde::Serialize;

/// Longest window a usage report covers, in days.
pub const MAX_DAYS: u32 = 366;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UsageLine {
    pub owner: OwnerId,
    /// `YYYY-MM-DD` (UTC).
    pub day: String,
    pub route: String,
    pub provider: String,
    /// `primary`, `hedge` or `retry`.
    pub kind: String,
    /// Attempts that reported usage.
    pub attempts: i64,
    /// Jobs this provider's answer won.
    pub jobs: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub tokens: i64,
    /// Tokens of answers that lost the race to another attempt.
    pub discarded_tokens: i64,
}

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct UsageTotals {
    pub jobs: i64,
    pub tokens: i64,
    /// Tokens spent on hedge attempts (won or not).
    pub hedge_tokens: i64,
    /// Tokens of answers thrown away (they lost the compare-and-swap).
    pub discarded_tokens: i64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct UsageReport {
    /// First day covered (UTC).
    pub from: String,
    pub days: u32,
    pub lines: Vec<UsageLine>,
    pub totals: UsageTotals,
    /// Per owner: tokens used today (UTC), what budgets are checked against.
    pub today: std::collections::BTreeMap<OwnerId, i64>,
}

pub fn day_text(day: i64) -> String {
    crate::clock::rfc3339(day * MS_PER_DAY)
        .chars()
        .take(10)
        .collect()
}

/// The last `days` days (today included) of `owner`, or of every owner.
pub async fn report(
    store: &dyn Store,
    clock: &dyn Clock,
    owner: Option<&OwnerId>,
    days: u32,
) -> Result<UsageReport, StoreError> {
    let days = days.clamp(1, MAX_DAYS);
    let today = day_of(clock.now_ms());
    let from = today - i64::from(days) + 1;
    let rows = store.usage(owner, from).await?;
    Ok(build(rows, from, days, today))
}

fn build(rows: Vec<UsageRow>, from: i64, days: u32, today: i64) -> UsageReport {
    let mut totals = UsageTotals::default();
    let mut by_owner_today = std::collections::BTreeMap::new();
    let lines = rows
        .into_iter()
        .map(|r| {
            let tokens = r.prompt_tokens + r.completion_tokens;
            totals.jobs += r.won;
            totals.tokens += tokens;
            totals.discarded_tokens += r.discarded_tokens;
            if r.kind == "hedge" {
                totals.hedge_tokens += tokens;
            }
            if r.day == today {
                *by_owner_today.entry(r.owner_id.clone()).or_insert(0) += tokens;
            }
            UsageLine {
                owner: r.owner_id,
                day: day_text(r.day),
                route: r.route,
                provider: r.provider,
                kind: r.kind,
                attempts: r.attempts,
                jobs: r.won,
                prompt_tokens: r.prompt_tokens,
                completion_tokens: r.completion_tokens,
                tokens,
                discarded_tokens: r.discarded_tokens,
            }
        })
        .collect();
    UsageReport {
        from: day_text(from),
        days,
        lines,
        totals,
        today: by_owner_today,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_print_as_dates() {
        assert_eq!(day_text(0), "1970-01-01");
        assert_eq!(day_text(20_422), "2025-11-30");
    }
}

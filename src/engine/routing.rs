//! Which provider an attempt goes to: the route's order, the gate (enabled,
//! contract-eligible as a fallback), the context window, the breaker, and
//! what the job's earlier attempts rule out (invariant 3).

use super::plan::JobPlan;
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::{Attempt, AttemptKind, AttemptState, ErrorKind};
use crate::providers::catalog::ProviderEntry;

/// Where a round's first attempt can go.
pub(super) enum Choice<'a> {
    Provider(&'a ProviderEntry),
    /// No provider on the route can ever take the prompt (context windows,
    /// capabilities): fail, with the kind that says why when it is the
    /// request's own (`context_length_exceeded` when every one was a
    /// window, else `invalid_request`); `None` when no provider of the
    /// route is configured.
    NoneFits(Option<ErrorKind>, String),
    /// None may take it now (disabled, ineligible): wait and try again.
    NoneAdmitted(String),
    /// Every provider that could take it has an attempt of this job whose
    /// outcome is unknown and does not honour idempotency keys: the job
    /// waits for reconciliation.
    Blocked(String),
}

/// How a retry is steered by what came before.
#[derive(Debug, Default, Clone)]
pub(super) struct Steer {
    /// Go along the route starting after this provider.
    pub after: Option<String>,
    /// Try this provider first (a same-provider retry of a retryable refusal).
    pub prefer: Option<String>,
    /// Only providers whose context window is larger than this (after a
    /// provider's `context_length_exceeded`).
    pub window_above: Option<u32>,
    /// Providers with an unknown attempt of the job that do not honour
    /// idempotency keys: nothing is re-sent there (invariant 3).
    pub blocked: Vec<String>,
}

impl Steer {
    /// The providers the job's attempts rule out: those with an unknown
    /// attempt, unless their provider file says they honour keys.
    pub fn blocked_by(inner: &Inner, attempts: &[Attempt]) -> Vec<String> {
        let mut blocked: Vec<String> = attempts
            .iter()
            .filter(|a| a.state == AttemptState::Unknown)
            .filter(|a| {
                !inner
                    .catalog
                    .get(&a.provider)
                    .is_some_and(|e| e.config.honours_idempotency_key)
            })
            .map(|a| a.provider.clone())
            .collect();
        blocked.sort();
        blocked.dedup();
        blocked
    }
}

/// The provider for a round: the primary for a first attempt (unless its
/// breaker is open); for a retry, the preferred provider, then the next ones
/// along the route after `steer.after`. Fallbacks must pass the gate as
/// fallbacks; every provider must hold prompt + max_tokens.
pub(super) fn choose_provider<'a>(
    inner: &'a Inner,
    route: &RouteConfig,
    plan: &JobPlan,
    kind: AttemptKind,
    steer: &Steer,
) -> Choice<'a> {
    let route_order: Vec<&String> = std::iter::once(&route.primary)
        .chain(route.fallbacks.iter())
        .collect();
    let start = match (kind, &steer.after) {
        (AttemptKind::Retry, Some(after)) => route_order
            .iter()
            .position(|p| *p == after)
            .map(|i| i + 1)
            .unwrap_or(0),
        _ => 0,
    };
    let mut order: Vec<&String> = (0..route_order.len())
        .map(|i| route_order[(start + i) % route_order.len()])
        .collect();
    if let Some(prefer) = &steer.prefer {
        if let Some(i) = order.iter().position(|p| *p == prefer) {
            let first = order.remove(i);
            order.insert(0, first);
        }
    }
    let now = inner.clock.now_ms();
    let (mut reasons, mut fits_somewhere, mut breaker_skipped) = (Vec::new(), false, None);
    let mut blocked = false;
    // Why the request fits nowhere, when it is the request's doing.
    let mut unfit: Option<ErrorKind> = None;
    for name in order {
        let Some(entry) = inner.catalog.get(name) else {
            reasons.push(format!("{name}: not configured"));
            continue;
        };
        if let Some(window) = steer.window_above {
            if entry.config.context_window <= window {
                unfit.get_or_insert(ErrorKind::ContextLengthExceeded);
                reasons.push(format!(
                    "{name}: context window {} is not larger than the {window} that was exceeded",
                    entry.config.context_window
                ));
                continue;
            }
        }
        if let Err(e) = plan.request_for(entry) {
            // A window too small anywhere is the prompt's length; anything
            // else a provider cannot take is the request's shape.
            if unfit != Some(ErrorKind::InvalidRequest) {
                unfit = Some(e.kind);
            }
            reasons.push(e.message);
            continue;
        }
        fits_somewhere = true;
        if steer.blocked.contains(name) {
            blocked = true;
            reasons.push(format!(
                "{name}: an attempt there has an unknown outcome and it does not honour idempotency keys"
            ));
            continue;
        }
        let as_fallback = *name != route.primary;
        if let Err(why) = inner.gate.admits(name, plan.contract_name(), as_fallback) {
            reasons.push(format!("{name}: {why}"));
            continue;
        }
        if kind == AttemptKind::Primary
            && !inner.with_breaker(name, |b| b.admits_first_attempt(now))
        {
            breaker_skipped.get_or_insert(entry);
            reasons.push(format!("{name}: circuit breaker open"));
            continue;
        }
        return Choice::Provider(entry);
    }
    // Every admitted provider has its breaker open: better the tripped one than none.
    if let Some(entry) = breaker_skipped {
        return Choice::Provider(entry);
    }
    if blocked {
        Choice::Blocked(reasons.join("; "))
    } else if fits_somewhere {
        Choice::NoneAdmitted(reasons.join("; "))
    } else {
        Choice::NoneFits(unfit, reasons.join("; "))
    }
}

/// A hedge target: the first provider on the route the job has not tried
/// (`tried`: every provider with an attempt of the job) that passes the
/// gate as a fallback, fits, and whose breaker is not open.
pub(super) fn choose_hedge<'a>(
    inner: &'a Inner,
    route: &RouteConfig,
    plan: &JobPlan,
    tried: &[String],
) -> Option<&'a ProviderEntry> {
    choose_continuation(inner, route, plan, tried, false)
}

/// A provider that may finish a stream broken mid-answer: a hedge target
/// that, with `prefill`, continues an assistant prefill; without, it is
/// asked for the whole answer again (a restart).
pub(super) fn choose_continuation<'a>(
    inner: &'a Inner,
    route: &RouteConfig,
    plan: &JobPlan,
    tried: &[String],
    prefill: bool,
) -> Option<&'a ProviderEntry> {
    std::iter::once(&route.primary)
        .chain(route.fallbacks.iter())
        .filter(|name| !tried.contains(name))
        .find_map(|name| {
            let entry = inner.catalog.get(name)?;
            if prefill && !entry.config.continues_prefill() {
                return None;
            }
            plan.request_for(entry).ok()?;
            let as_fallback = *name != route.primary;
            inner
                .gate
                .admits(name, plan.contract_name(), as_fallback)
                .ok()?;
            inner.with_breaker(name, |b| b.is_closed()).then_some(entry)
        })
}

//! Which provider an attempt goes to: the route's order, the gate (enabled,
//! contract-eligible as a fallback), the context window, the breaker.

use super::plan::JobPlan;
use super::Inner;
use crate::config::RouteConfig;
use crate::domain::AttemptKind;
use crate::providers::catalog::ProviderEntry;

/// Where a round's first attempt can go.
pub(super) enum Choice<'a> {
    Provider(&'a ProviderEntry),
    /// No provider on the route can ever take the prompt (context windows): fail.
    NoneFits(String),
    /// None may take it now (disabled, ineligible): wait and try again.
    NoneAdmitted(String),
}

/// The provider for a round: the primary for a first attempt (unless its
/// breaker is open), the next one along the route after the last failure for
/// a retry. Fallbacks must pass the gate as fallbacks; every provider must
/// hold prompt + max_tokens.
pub(super) fn choose_provider<'a>(
    inner: &'a Inner,
    route: &RouteConfig,
    plan: &JobPlan,
    kind: AttemptKind,
    last_failed: Option<&str>,
) -> Choice<'a> {
    let order: Vec<&String> = std::iter::once(&route.primary)
        .chain(route.fallbacks.iter())
        .collect();
    let start = match (kind, last_failed) {
        (AttemptKind::Retry, Some(failed)) => order
            .iter()
            .position(|p| *p == failed)
            .map(|i| i + 1)
            .unwrap_or(0),
        _ => 0,
    };
    let now = inner.clock.now_ms();
    let (mut reasons, mut fits_somewhere, mut breaker_skipped) = (Vec::new(), false, None);
    for i in 0..order.len() {
        let name = order[(start + i) % order.len()];
        let Some(entry) = inner.catalog.get(name) else {
            reasons.push(format!("{name}: not configured"));
            continue;
        };
        if let Err(e) = plan.request_for(entry) {
            reasons.push(e.0);
            continue;
        }
        fits_somewhere = true;
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
    if fits_somewhere {
        Choice::NoneAdmitted(reasons.join("; "))
    } else {
        Choice::NoneFits(reasons.join("; "))
    }
}

/// A hedge target: the first fallback not already tried in this round that
/// passes the gate as a fallback, fits, and whose breaker is not open.
pub(super) fn choose_hedge<'a>(
    inner: &'a Inner,
    route: &RouteConfig,
    plan: &JobPlan,
    busy: &[String],
) -> Option<&'a ProviderEntry> {
    route
        .fallbacks
        .iter()
        .filter(|name| !busy.contains(name))
        .find_map(|name| {
            let entry = inner.catalog.get(name)?;
            plan.request_for(entry).ok()?;
            inner.gate.admits(name, plan.contract_name(), true).ok()?;
            inner.with_breaker(name, |b| b.is_closed()).then_some(entry)
        })
}

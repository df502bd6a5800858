//! `onejob review list|resolve|resolve-attempt`: the review queue from the
//! command line, with the same rules and audit trail as the admin API.

use super::{open_existing_store, DbArgs};
use crate::clock::{rfc3339, Clock, SystemClock};
use crate::domain::reason::check_reason;
use crate::domain::{AttemptId, JobId};
use crate::jobs;
use crate::store::Refusal;
use anyhow::{anyhow, Context};

fn actor() -> String {
    std::env::var("USER")
        .map(|u| format!("cli:{u}"))
        .unwrap_or_else(|_| "cli".to_string())
}

fn reason(reason: &str) -> anyhow::Result<&str> {
    check_reason(reason).map_err(|e| anyhow::anyhow!("--reason: {e}"))
}

fn result_json(result: Option<&str>) -> anyhow::Result<Option<String>> {
    result
        .map(|text| {
            let value: serde_json::Value = serde_json::from_str(text)
                .context("--result must be JSON (quote a string: '\"text\"')")?;
            Ok(value.to_string())
        })
        .transpose()
}

fn refused(what: &str, id: &str, refusal: Refusal) -> anyhow::Error {
    anyhow::anyhow!("{what} {id}: {refusal}")
}

pub async fn list(db: &DbArgs) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let items = store.list_review(500).await;
    store.close().await;
    let items = items?;
    if items.is_empty() {
        println!("the review queue is empty");
        return Ok(());
    }
    println!(
        "{:<38} {:<16} {:<24} {:>8}  {:<24}  LAST ERROR",
        "JOB", "OWNER", "IDEMPOTENCY KEY", "ATTEMPTS", "LAST ATTEMPT"
    );
    for item in items {
        let job = item.job;
        println!(
            "{:<38} {:<16} {:<24} {:>8}  {:<24}  {}",
            job.id,
            job.owner_id,
            job.idempotency_key,
            job.attempt_count,
            item.last_attempt_at
                .map(rfc3339)
                .unwrap_or_else(|| "-".into()),
            job.last_error.unwrap_or_default()
        );
    }
    Ok(())
}

/// The contracts an admin's result is checked against, as a server loads
/// them.
fn loaded_contracts(
    config: &crate::config::Config,
) -> anyhow::Result<std::sync::Arc<std::collections::BTreeMap<String, crate::contracts::Contract>>>
{
    Ok(std::sync::Arc::new(if config.contracts_dir.exists() {
        crate::contracts::load_all(&config.contracts_dir)?
    } else {
        Default::default()
    }))
}

/// A refused result as the flag that gave it (`--result: …`).
fn resolution_refused(e: jobs::ResolutionError) -> anyhow::Error {
    match e {
        jobs::ResolutionError::Store(e) => e.into(),
        e => anyhow!("--{e}"),
    }
}

pub async fn resolve_job(
    db: &DbArgs,
    job_id: &JobId,
    action: &str,
    result: Option<&str>,
    why: &str,
) -> anyhow::Result<()> {
    let why = reason(why)?;
    let resolution =
        jobs::job_resolution(action, result_json(result)?).map_err(|e| anyhow!("--{e}"))?;
    let config = db.load(None)?;
    let contracts = loaded_contracts(&config)?;
    let store = open_existing_store(&config).await?;
    let outcome =
        match jobs::checked_resolution(store.as_ref(), &contracts, job_id, resolution).await {
            Ok(resolution) => {
                store
                    .resolve_job(job_id, resolution, &actor(), why, SystemClock.now_ms())
                    .await
            }
            Err(e) => {
                store.close().await;
                return Err(resolution_refused(e));
            }
        };
    store.close().await;
    let job = outcome?.map_err(|r| refused("job", job_id, r))?;
    println!(
        "job {} is now {} (version {})",
        job.id,
        job.state.as_str(),
        job.version
    );
    Ok(())
}

pub async fn resolve_attempt(
    db: &DbArgs,
    attempt_id: &AttemptId,
    outcome: &str,
    result: Option<&str>,
    why: &str,
) -> anyhow::Result<()> {
    let why = reason(why)?;
    let resolution =
        jobs::attempt_resolution(outcome, result_json(result)?).map_err(|e| anyhow!("--{e}"))?;
    let config = db.load(None)?;
    let contracts = loaded_contracts(&config)?;
    let store = open_existing_store(&config).await?;
    let settled =
        match jobs::checked_attempt_resolution(store.as_ref(), &contracts, attempt_id, resolution)
            .await
        {
            Ok(resolution) => {
                store
                    .resolve_attempt(attempt_id, resolution, &actor(), why, SystemClock.now_ms())
                    .await
            }
            Err(e) => {
                store.close().await;
                return Err(resolution_refused(e));
            }
        };
    store.close().await;
    let job = settled?.map_err(|r| refused("attempt", attempt_id, r))?;
    println!(
        "attempt {attempt_id} settled; job {} is now {} (version {})",
        job.id,
        job.state.as_str(),
        job.version
    );
    Ok(())
}

//! Contract runs (provider eligibility); the types are in
//! `store::contract_runs`.

use crate::store::contract_runs::{ContractRun, ContractRunSummary, NewContractRun};
use crate::store::sql::db::{args, Db};
use crate::store::StoreError;

pub(crate) async fn insert_contract_run(
    conn: &mut impl Db,
    mut run: NewContractRun,
) -> Result<(), StoreError> {
    // A provider's words (its error, its output) end up in the first
    // failure; the report is JSON, where a NUL is escaped.
    if let Some(failure) = &mut run.first_failure {
        crate::domain::text::storable(failure);
    }
    conn.execute(
        "INSERT INTO contract_runs (id, contract, contract_digest, provider, provider_digest, \
         passed, first_failure, report, started_at, finished_at, actor) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        args![
            &run.id,
            &run.contract,
            &run.contract_digest,
            &run.provider,
            &run.provider_digest,
            run.passed,
            &run.first_failure,
            &run.report,
            run.started_at,
            run.finished_at,
            &run.actor
        ],
    )
    .await?;
    Ok(())
}

/// The latest run of every (contract, provider) pair for each pair of
/// digests it was run with: no later run of the pair with the same
/// digests exists (ties on `finished_at` go to the larger id, which is
/// time-ordered). [`crate::contracts::eligibility::deciding_run`] picks
/// the one that counts.
pub(crate) async fn latest_contract_runs(
    conn: &mut impl Db,
) -> Result<Vec<ContractRunSummary>, StoreError> {
    let rows: Vec<ContractRunSummary> = conn
        .fetch_all(
            "SELECT r.id, r.contract, r.contract_digest, r.provider, r.provider_digest, r.passed, \
         r.first_failure, r.started_at, r.finished_at, r.actor FROM contract_runs r \
         WHERE NOT EXISTS (SELECT 1 FROM contract_runs n \
         WHERE n.contract = r.contract AND n.provider = r.provider \
         AND n.contract_digest = r.contract_digest AND n.provider_digest = r.provider_digest \
         AND (n.finished_at > r.finished_at OR (n.finished_at = r.finished_at AND n.id > r.id))) \
         ORDER BY r.contract, r.provider",
            args![],
        )
        .await?;
    Ok(rows)
}

pub(crate) async fn contract_run(
    conn: &mut impl Db,
    id: &str,
) -> Result<Option<ContractRun>, StoreError> {
    let run: Option<ContractRun> = conn
        .fetch_optional(
            "SELECT id, contract, contract_digest, provider, provider_digest, passed, \
         first_failure, started_at, finished_at, actor, report FROM contract_runs WHERE id = $1",
            args![id],
        )
        .await?;
    Ok(run)
}

//! Contract runs (provider eligibility); the types are in
//! `store::contract_runs`.

use super::Conn;
use crate::store::contract_runs::{ContractRun, ContractRunSummary, NewContractRun};
use crate::store::StoreError;

pub(crate) async fn insert_contract_run(
    conn: &mut Conn,
    run: NewContractRun,
) -> Result<(), StoreError> {
    sqlx::query(
        "INSERT INTO contract_runs (id, contract, contract_digest, provider, provider_digest, \
         passed, first_failure, report, started_at, finished_at, actor) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    )
    .bind(&run.id)
    .bind(&run.contract)
    .bind(&run.contract_digest)
    .bind(&run.provider)
    .bind(&run.provider_digest)
    .bind(run.passed)
    .bind(&run.first_failure)
    .bind(&run.report)
    .bind(run.started_at)
    .bind(run.finished_at)
    .bind(&run.actor)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The latest run of every (contract, provider) pair: no later run
/// of the pair exists (ties on `finished_at` go to the larger id,
/// which is time-ordered).
pub(crate) async fn latest_contract_runs(
    conn: &mut Conn,
) -> Result<Vec<ContractRunSummary>, StoreError> {
    let rows: Vec<ContractRunSummary> = sqlx::query_as(
        "SELECT r.id, r.contract, r.contract_digest, r.provider, r.provider_digest, r.passed, \
         r.first_failure, r.started_at, r.finished_at, r.actor FROM contract_runs r \
         WHERE NOT EXISTS (SELECT 1 FROM contract_runs n \
         WHERE n.contract = r.contract AND n.provider = r.provider \
         AND (n.finished_at > r.finished_at OR (n.finished_at = r.finished_at AND n.id > r.id))) \
         ORDER BY r.contract, r.provider",
    )
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows)
}

pub(crate) async fn contract_run(
    conn: &mut Conn,
    id: &str,
) -> Result<Option<ContractRun>, StoreError> {
    let run: Option<ContractRun> = sqlx::query_as(
        "SELECT id, contract, contract_digest, provider, provider_digest, passed, \
         first_failure, started_at, finished_at, actor, report FROM contract_runs WHERE id = $1",
    )
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    Ok(run)
}

//! Contract runs: each run of one contract against one provider, stored
//! with both digests and its full report, so eligibility can be decided
//! from the latest run of each (contract, provider) pair. Written once for
//! both backends like `ops.rs`; the types live here too.

use crate::domain::Millis;
use serde::Serialize;

/// A finished run, as the contract runner hands it to the store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewContractRun {
    pub id: String,
    pub contract: String,
    pub contract_digest: String,
    pub provider: String,
    pub provider_digest: String,
    pub passed: bool,
    /// The first failed check, as ops should read it; `None` when passed.
    pub first_failure: Option<String>,
    /// The `ContractReport` as JSON text.
    pub report: String,
    pub started_at: Millis,
    pub finished_at: Millis,
    pub actor: String,
}

/// A run without its report: what eligibility and listings need.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ContractRunSummary {
    pub id: String,
    pub contract: String,
    pub contract_digest: String,
    pub provider: String,
    pub provider_digest: String,
    pub passed: bool,
    pub first_failure: Option<String>,
    pub started_at: Millis,
    pub finished_at: Millis,
    pub actor: String,
}

/// A run with its report (JSON text of a `ContractReport`).
#[derive(Debug, Clone, PartialEq)]
pub struct ContractRun {
    pub summary: ContractRunSummary,
    pub report: String,
}

pub(crate) type SummaryRow = (
    String,
    String,
    String,
    String,
    String,
    bool,
    Option<String>,
    Millis,
    Millis,
    String,
);

pub(crate) fn summary_from_row(row: SummaryRow) -> ContractRunSummary {
    let (
        id,
        contract,
        contract_digest,
        provider,
        provider_digest,
        passed,
        first_failure,
        started_at,
        finished_at,
        actor,
    ) = row;
    ContractRunSummary {
        id,
        contract,
        contract_digest,
        provider,
        provider_digest,
        passed,
        first_failure,
        started_at,
        finished_at,
        actor,
    }
}

macro_rules! contract_run_ops {
    ($conn:ty) => {
        use crate::store::contract_runs::{
            summary_from_row, ContractRun, ContractRunSummary, NewContractRun, SummaryRow,
        };

        pub(crate) async fn insert_contract_run(
            conn: &mut $conn,
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
            conn: &mut $conn,
        ) -> Result<Vec<ContractRunSummary>, StoreError> {
            let rows: Vec<SummaryRow> = sqlx::query_as(
                "SELECT r.id, r.contract, r.contract_digest, r.provider, r.provider_digest, r.passed, \
                 r.first_failure, r.started_at, r.finished_at, r.actor FROM contract_runs r \
                 WHERE NOT EXISTS (SELECT 1 FROM contract_runs n \
                 WHERE n.contract = r.contract AND n.provider = r.provider \
                 AND (n.finished_at > r.finished_at OR (n.finished_at = r.finished_at AND n.id > r.id))) \
                 ORDER BY r.contract, r.provider",
            )
            .fetch_all(&mut *conn)
            .await?;
            Ok(rows.into_iter().map(summary_from_row).collect())
        }

        pub(crate) async fn contract_run(
            conn: &mut $conn,
            id: &str,
        ) -> Result<Option<ContractRun>, StoreError> {
            let row: Option<(String, String, String, String, String, bool, Option<String>, i64, i64, String, String)> =
                sqlx::query_as(
                    "SELECT id, contract, contract_digest, provider, provider_digest, passed, \
                     first_failure, started_at, finished_at, actor, report FROM contract_runs WHERE id = $1",
                )
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
            Ok(row.map(|(id, contract, contract_digest, provider, provider_digest, passed, first_failure, started_at, finished_at, actor, report)| {
                ContractRun {
                    summary: summary_from_row((
                        id,
                        contract,
                        contract_digest,
                        provider,
                        provider_digest,
                        passed,
                        first_failure,
                        started_at,
                        finished_at,
                        actor,
                    )),
                    report,
                }
            }))
        }
    };
}

pub(crate) use contract_run_ops;

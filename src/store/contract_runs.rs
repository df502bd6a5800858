//! Contract runs: each run of one contract against one provider, stored
//! with both digests and its full report, so eligibility can be decided
//! from the latest run of each (contract, provider) pair. The types; their
//! SQL is in `sql/contract_runs.rs`.

use crate::domain::Millis;
use crate::store::sql::db::{Columns, Row};
use crate::store::StoreError;
use async_trait::async_trait;
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

/// A run without its report: what eligibility and listings need. Read from
/// its row by column name.
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

impl Row for ContractRunSummary {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(ContractRunSummary {
            id: row.get("id")?,
            contract: row.get("contract")?,
            contract_digest: row.get("contract_digest")?,
            provider: row.get("provider")?,
            provider_digest: row.get("provider_digest")?,
            passed: row.get("passed")?,
            first_failure: row.get("first_failure")?,
            started_at: row.get("started_at")?,
            finished_at: row.get("finished_at")?,
            actor: row.get("actor")?,
        })
    }
}

/// A run with its report (JSON text of a `ContractReport`).
#[derive(Debug, Clone, PartialEq)]
pub struct ContractRun {
    pub summary: ContractRunSummary,
    pub report: String,
}

impl Row for ContractRun {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(ContractRun {
            summary: ContractRunSummary::decode(row)?,
            report: row.get("report")?,
        })
    }
}

#[async_trait]
pub trait ContractRunStore: Send + Sync {
    async fn insert_contract_run(&self, run: NewContractRun) -> Result<(), StoreError>;

    /// The latest run of each (contract, provider) pair for each pair of
    /// digests it ran with, by contract then provider: see
    /// [`crate::contracts::eligibility::deciding_run`].
    async fn latest_contract_runs(&self) -> Result<Vec<ContractRunSummary>, StoreError>;

    async fn contract_run(&self, id: &str) -> Result<Option<ContractRun>, StoreError>;
}

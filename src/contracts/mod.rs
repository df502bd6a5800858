//! Contracts: what a job's output must look like and how its prompt is built,
//! and the contract run that decides whether a provider may take over a job.
//!
//! A contract is a folder `contracts/NAME/` holding:
//! - `contract.toml`: version, description, system prompt, minijinja
//!   `template` for the user turn, `[params]` (temperature, max_tokens),
//!   `[tokenizer] prompt_token_tolerance`, `[round_trip] exact`, optional
//!   `[[few_shot]]` user/assistant pairs;
//! - `schema.json`: the output's JSON Schema (a top-level object);
//! - `cases/*.json`: test cases `{name, input, expect: {fields, values}}`.
//!
//! Modules, one concern each:
//! - [`definition`]: the files' shapes, loading with errors that name file
//!   and field, and the digest that makes old runs stale;
//! - [`render`]: template → prompt in a provider's wire format;
//! - [`output`]: schema validation of an answer and the round-trip rule;
//! - [`tokenizer`]: tiktoken checks on a rendered prompt and on reported usage;
//! - [`run`]: one contract against one live provider → [`ContractReport`];
//! - [`report`]: the report and its table / JUnit renderings;
//! - [`runner`]: the suite over the provider catalog, each run stored;
//! - [`eligibility`]: whether a provider may take a contract's jobs now.

pub mod definition;
pub mod eligibility;
pub mod output;
pub mod render;
pub mod report;
pub mod run;
pub mod runner;
pub mod tokenizer;

pub use definition::{load_all, Case, Contract, ContractError, Expectation};
pub use eligibility::{
    eligibility, Eligibility, EligibilityCache, EligibilitySnapshot, EligibilityStatus,
};
pub use output::{Problem, RoundTripMismatch, Violation};
pub use render::{RenderError, RenderedPrompt, WireFormat};
pub use report::{render_table, reports_to_junit_xml, CheckKind, CheckResult, ContractReport};
pub use run::{contract_run_key, run_contract, ProviderProfile};
pub use runner::{check_selection, profile_of, run_contracts, RunError};
pub use tokenizer::{
    check_prompt, check_usage_agreement, count_prompt_tokens, counted_with_tools,
    prompt_tokens_at_most, PromptTokens, TokenizerError, TokenizerViolation,
};

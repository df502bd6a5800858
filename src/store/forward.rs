//! The one forwarding macro: [`forward_store!`](crate::forward_store), shared
//! by the test wrappers that stand in front of a real store and forward
//! every query to it through a hook of their own — the fault-injecting
//! [`FaultyStore`](super::faulty::FaultyStore) and the simulation's
//! `SyncStore` (`tests/simulation/store.rs`).
//!
//! It repeats each resource trait's signatures once, which is what lets a
//! wrapper know every method by name ([`METHODS`](super::faulty::METHODS));
//! a trait method missing here is a compile error in both wrappers.

/// `forward_store!(names)`: the name of every query of the resource traits,
/// in trait order (`&[&str]`).
///
/// `forward_store!(impl Wrapper, inner_field, |this, name, call| hook)`: the
/// impl of every resource trait for `Wrapper`, each method
/// `async fn NAME(&self, args…) -> Result<T, StoreError> { hook }`, where
/// `this` is `&self`, `name` the method's name (`&'static str`) and `call`
/// the not yet polled future of the same call on `self.inner_field` (an
/// `Arc<dyn Store>`). The hook decides what happens around it:
/// `{ this.before(name).await?; let r = call.await; this.after(name, r).await }`.
/// The [`Store`](super::Store) methods of its own (`backend`, `migrate`,
/// `ping`, `record_event_detached`, `close`) each wrapper writes by hand.
#[doc(hidden)]
#[macro_export]
macro_rules! forward_store {
    (names) => {
        $crate::forward_store!(@list names)
    };
    (impl $wrapper:ty, $inner:ident, |$this:ident, $name:ident, $call:ident| $hook:expr) => {
        $crate::forward_store! { @list impl [$wrapper] [$inner] [$this $name $call] [$hook] }
    };
    (@list $($how:tt)*) => {
        $crate::forward_store! {
            @expand [$($how)*]
            JobStore {
                fn create_job(job: NewJob) -> CreateOutcome;
                fn find_job_by_key(owner_id: &OwnerId, key: &str) -> Option<Job>;
                fn latest_job_by_keys(owner_id: &OwnerId, keys: &[String]) -> Option<Job>;
                fn get_job(id: &JobId) -> Option<Job>;
                fn count_jobs() -> i64;
                fn claim_jobs(owner: &str, now: Millis, lease_until: Millis, limit: i64, reclaim_own: bool) -> Vec<Job>;
                fn renew_lease(job_id: &JobId, owner: &str, lease_until: Millis) -> bool;
                fn transition_job(job_id: &JobId, lease_owner: Option<&str>, transition: JobTransition, at: Millis) -> bool;
                fn wake_job(job_id: &JobId, at: Millis) -> ();
                fn cancel_job(job_id: &JobId, actor: &str, reason: &str, at: Millis) -> Result<Job, Refusal>;
                fn request_retry(job_id: &JobId, actor: &str, at: Millis) -> Result<Job, Refusal>;
                fn resolve_job(job_id: &JobId, resolution: JobResolution, actor: &str, reason: &str, at: Millis) -> Result<Job, Refusal>;
                fn list_review(limit: i64) -> Vec<ReviewItem>;
            }
            AttemptStore {
                fn list_attempts(job_id: &JobId) -> Vec<Attempt>;
                fn get_attempt(attempt_id: &AttemptId) -> Option<Attempt>;
                fn start_attempt(attempt: NewAttempt) -> Result<Attempt, GuardRefusal>;
                fn finish_attempt(finish: FinishAttempt) -> FinishOutcome;
                fn list_unknown_attempts(after: Option<(Millis, &AttemptId)>, limit: i64) -> Vec<Attempt>;
                fn list_stale_started(started_before: Millis, limit: i64) -> Vec<Attempt>;
                fn resolve_attempt(attempt_id: &AttemptId, resolution: AttemptResolution, actor: &str, reason: &str, at: Millis) -> Result<Job, Refusal>;
            }
            EventStore {
                fn record_event(event: NewEvent) -> ();
                fn record_events(events: Vec<NewEvent>) -> ();
                fn list_events(job_id: &JobId) -> Vec<JobEvent>;
                fn has_event(job_id: &JobId, kind: &str) -> bool;
            }
            KeyStore {
                fn insert_api_key(key: ApiKey, actor: &str) -> ();
                fn find_api_key(key_hash: &str) -> Option<ApiKey>;
                fn list_api_keys(owner: Option<&OwnerId>) -> Vec<KeyRecord>;
                fn get_api_key(id: &str) -> Option<KeyRecord>;
                fn revoke_api_key(id: &str, actor: &str, reason: Option<&str>, at: Millis) -> bool;
                fn rotate_api_key(rotation: Rotation, actor: &str) -> bool;
                fn touch_api_keys(used: Vec<(String, Millis)>) -> ();
                fn tenant_changes() -> i64;
                fn owner_limits() -> Vec<OwnerLimitsRow>;
                fn set_owner_limits(row: OwnerLimitsRow) -> ();
                fn tenant_audit(limit: i64) -> Vec<TenantAuditEntry>;
                fn heartbeat(instance: &str, at: Millis, since: Millis) -> i64;
                fn leave_instances(instance: &str) -> ();
                fn owner_load(owner: &OwnerId, key: Option<&str>, day: i64) -> OwnerLoad;
                fn set_key_limits(id: &str, limits: Option<String>, actor: &str, reason: &str, at: Millis) -> bool;
                fn usage(owner: Option<&OwnerId>, from_day: i64) -> Vec<UsageRow>;
            }
            SwitchStore {
                fn set_provider_enabled(name: &str, enabled: bool, actor: &str, reason: &str, at: Millis) -> ();
                fn provider_switches() -> Vec<ProviderSwitch>;
                fn provider_audit(name: Option<&str>, limit: i64) -> Vec<ProviderAuditEntry>;
            }
            ContractRunStore {
                fn insert_contract_run(run: NewContractRun) -> ();
                fn latest_contract_runs() -> Vec<ContractRunSummary>;
                fn contract_run(id: &str) -> Option<ContractRun>;
            }
            ConsoleStore {
                fn review_queue_depth() -> i64;
                fn list_jobs(filter: &JobFilter, limit: i64) -> Vec<Job>;
                fn window_stats(from: Millis, to: Millis, column_ms: i64) -> WindowStats;
            }
            HedgingStore {
                fn put_hedging_shares(shares: Vec<HedgingShare>, forget_before: Millis) -> ();
                fn hedging_shares(since: Millis) -> Vec<HedgingShare>;
            }
            WebhookStore {
                fn insert_webhook_endpoint(endpoint: WebhookEndpoint) -> ();
                fn list_webhook_endpoints(owner: Option<&OwnerId>) -> Vec<WebhookEndpoint>;
                fn get_webhook_endpoint(id: &str) -> Option<WebhookEndpoint>;
                fn delete_webhook_endpoint(id: &str) -> bool;
                fn rotate_webhook_secret(id: &str, secret: &str, previous_until: Millis, at: Millis) -> bool;
                fn claim_webhook_deliveries(instance: &str, now: Millis, lease_until: Millis, limit: i64, per_endpoint: i64) -> Vec<ClaimedDelivery>;
                fn record_webhook_try(record: WebhookTryRecord) -> bool;
                fn list_webhook_deliveries(endpoint_id: &str, limit: i64) -> Vec<WebhookDelivery>;
                fn get_webhook_delivery(id: &str) -> Option<WebhookDelivery>;
                fn list_webhook_tries(delivery_id: &str) -> Vec<WebhookTry>;
                fn redeliver_webhook(id: &str, at: Millis) -> bool;
                fn webhook_counts() -> WebhookCounts;
            }
        }
    };
    (@expand [names] $($trait:ident { $(fn $method:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)* })*) => {
        &[$($(stringify!($method)),*),*]
    };
    (
        @expand [impl [$wrapper:ty] [$inner:ident] [$this:ident $name:ident $call:ident] [$hook:expr]]
        $($trait:ident { $(fn $method:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)* })*
    ) => {
        const _: () = {
            use $crate::domain::attempt::NewAttempt;
            use $crate::domain::job::NewJob;
            use $crate::domain::{Attempt, AttemptId, GuardRefusal, Job, JobId, Millis, OwnerId};
            use $crate::store::console::{JobFilter, WindowStats};
            use $crate::store::hedging::HedgingShare;
            use $crate::store::tenants::{
                KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow,
            };
            use $crate::store::webhooks::{
                ClaimedDelivery, WebhookCounts, WebhookDelivery, WebhookEndpoint, WebhookTry,
                WebhookTryRecord,
            };
            use $crate::store::{
                ApiKey, AttemptResolution, ContractRun, ContractRunSummary, CreateOutcome,
                FinishAttempt, FinishOutcome, JobEvent, JobResolution, JobTransition,
                NewContractRun, NewEvent, ProviderAuditEntry, ProviderSwitch, Refusal,
                ReviewItem, StoreError,
            };
            $(
                #[::async_trait::async_trait]
                impl $crate::store::$trait for $wrapper {
                    $(
                        async fn $method(&self, $($arg: $ty),*) -> Result<$ret, StoreError> {
                            let $this = self;
                            let $name: &'static str = stringify!($method);
                            let $call = $crate::store::$trait::$method(&*self.$inner, $($arg),*);
                            $hook
                        }
                    )*
                }
            )*
        };
    };
}

//! Test helpers: a real server on port 0 over a fresh database per test,
//! on SQLite (a temp file) or PostgreSQL (a new database on the server
//! `ONEJOB_TEST_POSTGRES_URL` points at).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use onejob::clock::SystemClock;
use onejob::config::{Config, DatabaseUrl, Overrides};
use onejob::store::{self, Store};
use std::path::PathBuf;
use std::sync::Arc;
use tokio::sync::oneshot;

pub mod clients;
pub mod node;
pub mod procs;
pub mod python;
pub mod receiver;
pub mod webdriver;
pub mod world;

pub const PG_ENV: &str = "ONEJOB_TEST_POSTGRES_URL";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// Generates one `#[tokio::test]` per backend for an `async fn(Backend)`.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    super::$name($crate::common::Backend::Sqlite).await;
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    if $crate::common::postgres_admin_url().is_none() {
                        return;
                    }
                    super::$name($crate::common::Backend::Postgres).await;
                }
            }
        )*
    };
}

/// The PostgreSQL server to create test databases on, or `None` (and a loud
/// line on stderr) when PostgreSQL tests are not enabled.
pub fn postgres_admin_url() -> Option<String> {
    match std::env::var(PG_ENV) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            // Written to the real stderr, past the test harness's capture, so
            // the skip shows in `cargo test` output; once per test binary.
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED (PostgreSQL): the PostgreSQL variants of these tests pass without running; \
                     set {PG_ENV}=postgres://postgres@127.0.0.1:5432/postgres to run them"
                );
            });
            None
        }
    }
}

/// A fresh, empty database for one test.
pub struct TestDb {
    pub url: DatabaseUrl,
    _dir: Option<tempfile::TempDir>,
}

impl TestDb {
    pub async fn new(backend: Backend) -> TestDb {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().unwrap();
                let path: PathBuf = dir.path().join("onejob.db");
                TestDb {
                    url: DatabaseUrl::Sqlite(path),
                    _dir: Some(dir),
                }
            }
            Backend::Postgres => {
                use sqlx::Connection;
                let admin =
                    postgres_admin_url().expect("postgres tests need ONEJOB_TEST_POSTGRES_URL");
                let name = format!("onejob_t_{}", uuid::Uuid::new_v4().simple());
                let mut conn = sqlx::PgConnection::connect(&admin).await.unwrap();
                // A generated identifier of [a-z0-9_]; CREATE DATABASE takes no bind parameters.
                sqlx::query(&format!("CREATE DATABASE {name}"))
                    .execute(&mut conn)
                    .await
                    .unwrap();
                conn.close().await.unwrap();
                let base = admin.rsplit_once('/').map(|(b, _)| b).unwrap_or(&admin);
                TestDb {
                    url: DatabaseUrl::Postgres(format!("{base}/{name}")),
                    _dir: None,
                }
            }
        }
    }

    pub async fn store(&self) -> Arc<dyn Store> {
        let store = store::connect(&self.url).await.unwrap();
        store.migrate().await.unwrap();
        store
    }

    /// Run `sql` on the database directly, beside the store: a test's way
    /// to put rows where no store call puts them (a job in any state, a
    /// job made long ago). The rows it changed.
    pub async fn execute(&self, sql: &str) -> u64 {
        use sqlx::Connection;
        match &self.url {
            DatabaseUrl::Sqlite(path) => {
                let url = format!("sqlite://{}", path.display());
                let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::query(sql)
                    .execute(&mut conn)
                    .await
                    .unwrap()
                    .rows_affected()
            }
            DatabaseUrl::Postgres(url) => {
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query(sql)
                    .execute(&mut conn)
                    .await
                    .unwrap()
                    .rows_affected()
            }
        }
    }

    /// The one number `sql` (a `SELECT` of one row and column) answers,
    /// read on the database directly.
    pub async fn number(&self, sql: &str) -> i64 {
        use sqlx::Connection;
        match &self.url {
            DatabaseUrl::Sqlite(path) => {
                let url = format!("sqlite://{}", path.display());
                let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
            }
            DatabaseUrl::Postgres(url) => {
                let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
                sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap()
            }
        }
    }

    pub fn url_string(&self) -> String {
        match &self.url {
            DatabaseUrl::Sqlite(p) => p.display().to_string(),
            DatabaseUrl::Postgres(u) => u.clone(),
        }
    }
}

pub struct TestApp {
    pub address: String,
    pub store: Arc<dyn Store>,
    pub client: reqwest::Client,
    /// Key of owner "alice".
    pub key: String,
    /// Key of owner "bob".
    pub other_key: String,
    pub db: TestDb,
    shutdown: Option<oneshot::Sender<()>>,
    server: Option<tokio::task::JoinHandle<()>>,
}

/// A server that accepts and stores jobs but runs none (API tests).
pub fn test_config(db: &TestDb) -> Config {
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        database_url: Some(db.url_string()),
    };
    let mut config = Config::load(None, &overrides).unwrap();
    config.engine.enabled = false;
    config
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    let db = TestDb::new(backend).await;
    let config = test_config(&db);
    let store = db.store().await;
    let (address, tx, server) = world::serve(config, store.clone()).await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let other_key = onejob::keys::create_key(store.as_ref(), &SystemClock, "bob", false)
        .await
        .unwrap();
    TestApp {
        address,
        store,
        client: reqwest::Client::new(),
        key,
        other_key,
        db,
        shutdown: Some(tx),
        server: Some(server),
    }
}

impl TestApp {
    pub async fn post_job(
        &self,
        key: &str,
        idempotency_key: &str,
        body: &serde_json::Value,
    ) -> reqwest::Response {
        self.post_job_raw(key, Some(idempotency_key), body.to_string().into_bytes())
            .await
    }

    pub async fn post_job_raw(
        &self,
        key: &str,
        idempotency_key: Option<&str>,
        body: Vec<u8>,
    ) -> reqwest::Response {
        let mut request = self
            .client
            .post(format!("{}/v1/jobs", self.address))
            .bearer_auth(key)
            .header("content-type", "application/json")
            .body(body);
        if let Some(k) = idempotency_key {
            request = request.header("Idempotency-Key", k);
        }
        request.send().await.unwrap()
    }

    pub async fn get(&self, key: &str, path: &str) -> reqwest::Response {
        self.client
            .get(format!("{}{path}", self.address))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
    }

    /// Stop the server gracefully and wait until it has flushed the store.
    pub async fn stop(mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(server) = self.server.take() {
            server.await.unwrap();
        }
    }
}

/// A minimal valid job body.
pub fn chat_body(text: &str) -> serde_json::Value {
    serde_json::json!({ "messages": [{ "role": "user", "content": text }], "params": { "temperature": 0 } })
}

pub async fn error_code(response: reqwest::Response) -> String {
    let body: serde_json::Value = response.json().await.unwrap();
    body["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// A new job of `owner` under `key`, created at `at` through the store,
/// with no primary attempt.
pub async fn create_job(
    store: &dyn Store,
    owner: &str,
    key: &str,
    at: i64,
) -> onejob::domain::JobId {
    let new = onejob::domain::job::NewJob {
        id: onejob::domain::JobId::new(),
        owner_id: owner.into(),
        idempotency_key: key.into(),
        fingerprint: "f".into(),
        request: "{}".into(),
        route: "default".into(),
        created_at: at,
        lease: None,
        key_id: None,
        primary: None,
    };
    match store.create_job(new).await.unwrap() {
        onejob::store::CreateOutcome::Created(job) => job.id,
        other => panic!("expected a new job, got {other:?}"),
    }
}

/// An attempt of `job` on `provider` started at `at` through the store's
/// guarded start, which must let it start.
pub async fn start_attempt(
    store: &dyn Store,
    job: &onejob::domain::JobId,
    provider: &str,
    kind: onejob::domain::AttemptKind,
    at: i64,
) -> onejob::domain::AttemptId {
    store
        .start_attempt(onejob::domain::attempt::NewAttempt {
            id: onejob::domain::AttemptId::new(),
            job_id: job.clone(),
            provider: provider.into(),
            kind,
            max_hedges: 1,
            reuses_key: false,
            started_at: at,
        })
        .await
        .unwrap()
        .expect("the guard lets it start")
        .id
}

/// Test setup only: insert a `started` attempt row directly, bypassing the
/// guard, to build states the guard would never allow (e.g. twenty live
/// attempts at one version, to race their CAS).
pub async fn insert_started_attempt_unguarded(
    db: &TestDb,
    job_id: &onejob::domain::JobId,
    seq: i64,
) -> onejob::domain::AttemptId {
    use sqlx::Connection;
    let id = onejob::domain::AttemptId::new();
    let sql =
        "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
               VALUES ($1, $2, $3, 'sim', 'hedge', 'started', 0, 0)";
    match &db.url {
        DatabaseUrl::Sqlite(path) => {
            let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                .await
                .unwrap();
            sqlx::query(sql)
                .bind(id.as_str())
                .bind(job_id.as_str())
                .bind(seq)
                .execute(&mut conn)
                .await
                .unwrap();
        }
        DatabaseUrl::Postgres(url) => {
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            sqlx::query(sql)
                .bind(id.as_str())
                .bind(job_id.as_str())
                .bind(seq)
                .execute(&mut conn)
                .await
                .unwrap();
        }
    }
    id
}

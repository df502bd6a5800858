//! A database onejob did not make, or one a newer onejob migrated, is
//! refused with words an operator can act on, and nothing is written to
//! it: the migrator's own table was left behind in another program's
//! database, SQLite's refusal quoted a whole migration, and a newer build's
//! database was "migration 17 was previously applied but is missing".
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::store::{self, StoreError};

on_both_backends!(
    another_programs_database_is_refused_untouched,
    a_database_a_newer_build_migrated_says_so,
);

/// How many tables named `table` the database has (0 or 1).
async fn tables_named(db: &TestDb, backend: Backend, table: &str) -> i64 {
    let sql = match backend {
        Backend::Sqlite => {
            format!("SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = '{table}'")
        }
        Backend::Postgres => format!(
            "SELECT COUNT(*) FROM pg_tables WHERE schemaname = current_schema() AND tablename = '{table}'"
        ),
    };
    db.number(&sql).await
}

async fn another_programs_database_is_refused_untouched(backend: Backend) {
    let db = TestDb::new(backend).await;
    let opened = store::connect(&db.url).await.unwrap();
    db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, title TEXT)")
        .await;
    db.execute("INSERT INTO jobs (id, title) VALUES (1, 'theirs')")
        .await;
    let refused = opened.migrate().await.unwrap_err();
    assert!(matches!(refused, StoreError::NotOnejob), "{refused:?}");
    let words = refused.to_string();
    assert!(words.contains("not a onejob database"), "{words}");
    assert!(!words.contains("CREATE"), "no migration quoted: {words}");
    assert_eq!(tables_named(&db, backend, "_sqlx_migrations").await, 0);
    assert_eq!(db.number("SELECT COUNT(*) FROM jobs").await, 1);
    assert_eq!(tables_named(&db, backend, "attempts").await, 0);
}

async fn a_database_a_newer_build_migrated_says_so(backend: Backend) {
    let db = TestDb::new(backend).await;
    drop(db.store().await);
    let checksum = match backend {
        Backend::Sqlite => "X'00'",
        Backend::Postgres => "'\\x00'::bytea",
    };
    db.execute(&format!(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES (9999, 'from a newer build', TRUE, {checksum}, 0)"
    ))
    .await;
    let refused = store::connect(&db.url)
        .await
        .unwrap()
        .migrate()
        .await
        .unwrap_err();
    let words = refused.to_string();
    assert!(
        words.contains("migrated by a newer onejob") && words.contains("migration 9999"),
        "{words}"
    );
    assert!(!refused.is_transient());
}

//! The SQL compiled for SQLite. Every write runs inside `BEGIN IMMEDIATE`
//! (the write queue), which already excludes every other writer, in this
//! process or another: no row lock is needed and claims never race.

pub(crate) type Conn = sqlx::SqliteConnection;

// The dialect's fragments, literals for `concat!`. They are defined before
// the resource modules below, so that those see them.

/// The row lock of a guarded step: none (`BEGIN IMMEDIATE` excludes every writer).
macro_rules! for_update {
    () => {
        ""
    };
}

/// Concurrent claims passing over each other: none (writes are serialised).
macro_rules! skip_locked {
    () => {
        ""
    };
}

/// The idempotency key as its index (`jobs_by_key`) compares it, in byte
/// order: SQLite's BINARY collation already is.
macro_rules! key_indexed {
    () => {
        "idempotency_key"
    };
}

/// The same comparison, kept off that index (unary `+`).
macro_rules! key_unindexed {
    () => {
        "+idempotency_key"
    };
}

/// The shard of a rollup row (`usage_daily`, `attempt_hours`; migration
/// 0009) that the attempt with id `$id` adds to: always 0: writes are serialised by the write lock anyway.
macro_rules! rollup_shard {
    ($id:literal) => {
        "0"
    };
}

/// Whether `WITH` may hold inserts (none: DML in `WITH` is PostgreSQL's).
const WRITABLE_CTE: bool = false;

resource_modules!();

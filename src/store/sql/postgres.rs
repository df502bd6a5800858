//! The SQL compiled for PostgreSQL. A guarded step locks the row it decides
//! about with `FOR UPDATE` inside its READ COMMITTED transaction, so every
//! later statement of that transaction sees what the previous holder
//! committed; dispatchers claim with `SKIP LOCKED`.

pub(crate) type Conn = sqlx::PgConnection;

// The dialect's fragments, literals for `concat!`. They are defined before
// the resource modules below, so that those see them.

/// The row lock of a guarded step.
macro_rules! for_update {
    () => {
        " FOR UPDATE"
    };
}

/// Concurrent claims pass over each other's locked rows.
macro_rules! skip_locked {
    () => {
        " FOR UPDATE SKIP LOCKED"
    };
}

/// The idempotency key as its index (`jobs_by_key`) compares it, in byte
/// order (the index is built with `COLLATE "C"`).
macro_rules! key_indexed {
    () => {
        "idempotency_key COLLATE \"C\""
    };
}

/// The same comparison where SQLite keeps it off the index: the same text
/// here (unary `+` is not defined on text); the planner picks the plan.
macro_rules! key_unindexed {
    () => {
        "idempotency_key COLLATE \"C\""
    };
}

/// The shard of a rollup row (`usage_daily`, `attempt_hours`; migration
/// 0009) that the attempt with id `$id` adds to: one of 16, by the id's hash: concurrent finishes of one owner (or provider) upsert different rows, not one row each waits on.
macro_rules! rollup_shard {
    ($id:literal) => {
        concat!("(hashtext(", $id, ") & 15)")
    };
}

/// Whether `WITH` may hold inserts (a step written as one statement of writable CTEs commits on its own, in one round trip).
const WRITABLE_CTE: bool = true;

resource_modules!();

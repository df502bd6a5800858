//! One query API over the store's connections: sqlx's PostgreSQL
//! connection and rusqlite's SQLite connection (the writer's and the
//! readers').
//!
//! A query written against [`Db`] is written once and runs on any of them.
//! Where the two databases need different SQL, the connection names its
//! [`Dialect`] (`Db::Sql`), and the query takes that dialect's statement
//! (`sql/sqlite.rs`, `sql/postgres.rs`).
//!
//! Arguments are bound by position (`$1`, `$2`, … in the SQL, as everywhere
//! in the store), each an [`Arg`]: an integer, a boolean or a text, any
//! possibly NULL, which is every type the store binds. Rows are decoded by
//! column name ([`Row`]), the same code for every connection.

use super::Dialect;
use crate::store::StoreError;
use std::future::Future;

/// One bound argument.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Arg<'a> {
    Int(Option<i64>),
    Bool(Option<bool>),
    Text(Option<&'a str>),
}

/// What can be bound as an [`Arg`].
pub(crate) trait IntoArg<'a> {
    fn arg(self) -> Arg<'a>;
}

impl<'a> IntoArg<'a> for i64 {
    fn arg(self) -> Arg<'a> {
        Arg::Int(Some(self))
    }
}

impl<'a> IntoArg<'a> for Option<i64> {
    fn arg(self) -> Arg<'a> {
        Arg::Int(self)
    }
}

impl<'a> IntoArg<'a> for bool {
    fn arg(self) -> Arg<'a> {
        Arg::Bool(Some(self))
    }
}

impl<'a> IntoArg<'a> for &'a str {
    fn arg(self) -> Arg<'a> {
        Arg::Text(Some(self))
    }
}

impl<'a> IntoArg<'a> for &'a String {
    fn arg(self) -> Arg<'a> {
        Arg::Text(Some(self))
    }
}

impl<'a> IntoArg<'a> for Option<&'a str> {
    fn arg(self) -> Arg<'a> {
        Arg::Text(self)
    }
}

impl<'a> IntoArg<'a> for &'a Option<String> {
    fn arg(self) -> Arg<'a> {
        Arg::Text(self.as_deref())
    }
}

/// `args![a, b, c]`: the arguments of a [`Db`] query, `$1`, `$2`, `$3`.
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        &[$($crate::store::sql::db::IntoArg::arg($value)),*]
    };
}
pub(crate) use args;

/// A column value every connection decodes.
pub(crate) trait Value:
    Sized
    + Send
    + rusqlite::types::FromSql
    + for<'r> sqlx::Decode<'r, sqlx::Postgres>
    + sqlx::Type<sqlx::Postgres>
{
}

impl<T> Value for T where
    T: Sized
        + Send
        + rusqlite::types::FromSql
        + for<'r> sqlx::Decode<'r, sqlx::Postgres>
        + sqlx::Type<sqlx::Postgres>
{
}

/// One row as a connection answered it: its columns by name or position.
pub(crate) trait Columns {
    fn get<T: Value>(&self, column: &str) -> Result<T, StoreError>;
    fn at<T: Value>(&self, index: usize) -> Result<T, StoreError>;
}

/// A rusqlite row, read column by column. rusqlite finds a column by name
/// by comparing it with every column's name in turn; a row type reads its
/// columns in the order its statement lists them, so the column after the
/// last one read is tried first.
pub(crate) struct SqliteRow<'r, 's> {
    row: &'r rusqlite::Row<'s>,
    next: std::cell::Cell<usize>,
}

impl<'r, 's> SqliteRow<'r, 's> {
    pub(crate) fn new(row: &'r rusqlite::Row<'s>) -> Self {
        SqliteRow {
            row,
            next: std::cell::Cell::new(0),
        }
    }
}

impl Columns for SqliteRow<'_, '_> {
    fn get<T: Value>(&self, column: &str) -> Result<T, StoreError> {
        let statement = self.row.as_ref();
        let next = self.next.get();
        let index = match statement.column_name(next) {
            Ok(name) if name == column => next,
            _ => statement.column_index(column)?,
        };
        self.next.set(index + 1);
        Ok(self.row.get(index)?)
    }
    fn at<T: Value>(&self, index: usize) -> Result<T, StoreError> {
        Ok(self.row.get(index)?)
    }
}

impl Columns for sqlx::postgres::PgRow {
    fn get<T: Value>(&self, column: &str) -> Result<T, StoreError> {
        Ok(sqlx::Row::try_get(self, column)?)
    }
    fn at<T: Value>(&self, index: usize) -> Result<T, StoreError> {
        Ok(sqlx::Row::try_get(self, index)?)
    }
}

/// A row type a [`Db`] query can return, decoded from its columns: one
/// `decode` for every connection.
pub(crate) trait Row: Sized + Send {
    fn decode(row: &impl Columns) -> Result<Self, StoreError>;
}

impl<A: Value> Row for (A,) {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok((row.at(0)?,))
    }
}

impl<A: Value, B: Value> Row for (A, B) {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok((row.at(0)?, row.at(1)?))
    }
}

impl<A: Value, B: Value, C: Value> Row for (A, B, C) {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok((row.at(0)?, row.at(1)?, row.at(2)?))
    }
}

impl<A: Value, B: Value, C: Value, D: Value> Row for (A, B, C, D) {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok((row.at(0)?, row.at(1)?, row.at(2)?, row.at(3)?))
    }
}

impl<A: Value, B: Value, C: Value, D: Value, E: Value> Row for (A, B, C, D, E) {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok((row.at(0)?, row.at(1)?, row.at(2)?, row.at(3)?, row.at(4)?))
    }
}

impl<A: Value, B: Value, C: Value, D: Value, E: Value, F: Value> Row for (A, B, C, D, E, F) {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        let (a, b, c, d, e) = <(A, B, C, D, E)>::decode(row)?;
        Ok((a, b, c, d, e, row.at(5)?))
    }
}

/// A connection that runs [`Db`] queries.
pub(crate) trait Db: Send {
    /// The SQL this connection speaks where the databases differ.
    type Sql: Dialect;

    /// Run one statement; how many rows it changed.
    fn execute(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Run one statement whose text varies (a multi-row insert): not kept
    /// among the connection's prepared statements, where it would push out
    /// the job path's own.
    fn execute_once(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<u64, StoreError>> + Send;

    /// Run one statement that answers at most one row (a `RETURNING`
    /// statement is run to its end all the same).
    fn fetch_optional<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Option<R>, StoreError>> + Send;

    /// Run one statement; every row it answers.
    fn fetch_all<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<Vec<R>, StoreError>> + Send;

    /// Run one statement that always answers a row (an aggregate).
    fn fetch_one<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> impl Future<Output = Result<R, StoreError>> + Send {
        async move {
            self.fetch_optional(sql, args)
                .await?
                .ok_or(StoreError::NotFound("row of an aggregate"))
        }
    }
}

/// Drive a [`Db`] query on a rusqlite connection: its future never waits.
pub(crate) fn now<T>(query: impl Future<Output = T>) -> T {
    match futures::FutureExt::now_or_never(query) {
        Some(answer) => answer,
        None => unreachable!("a rusqlite query never waits"),
    }
}

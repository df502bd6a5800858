//! The id types ([`JobId`], [`AttemptId`], [`OwnerId`]) in the store: each
//! is bound and decoded exactly as the `String` it wraps (a TEXT column on
//! both dialects), so a query binds `&job.id` or `&event.attempt_id` as it
//! bound the `String` before, through sqlx (`.bind`, `push_bind`, a
//! `FromRow` field) and through [`args!`](super::sql::db::args) alike.

use super::sql::db::{Arg, IntoArg};
use crate::domain::{AttemptId, JobId, OwnerId};
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::Database;

macro_rules! stored_as_text {
    ($($id:ty),*) => {$(
        impl<DB: Database> sqlx::Type<DB> for $id
        where
            String: sqlx::Type<DB>,
        {
            fn type_info() -> DB::TypeInfo {
                <String as sqlx::Type<DB>>::type_info()
            }

            fn compatible(ty: &DB::TypeInfo) -> bool {
                <String as sqlx::Type<DB>>::compatible(ty)
            }
        }

        impl<'q, DB: Database> sqlx::Encode<'q, DB> for $id
        where
            String: sqlx::Encode<'q, DB>,
        {
            fn encode_by_ref(
                &self,
                buf: &mut <DB as Database>::ArgumentBuffer<'q>,
            ) -> Result<IsNull, BoxDynError> {
                <String as sqlx::Encode<'q, DB>>::encode_by_ref(self.as_string(), buf)
            }

            fn produces(&self) -> Option<DB::TypeInfo> {
                <String as sqlx::Encode<'q, DB>>::produces(self.as_string())
            }

            fn size_hint(&self) -> usize {
                <String as sqlx::Encode<'q, DB>>::size_hint(self.as_string())
            }
        }

        impl<'r, DB: Database> sqlx::Decode<'r, DB> for $id
        where
            String: sqlx::Decode<'r, DB>,
        {
            fn decode(value: <DB as Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
                <String as sqlx::Decode<'r, DB>>::decode(value).map(<$id>::from)
            }
        }

        impl<'a> IntoArg<'a> for &'a $id {
            fn arg(self) -> Arg<'a> {
                Arg::Text(Some(self.as_str()))
            }
        }

        impl<'a> IntoArg<'a> for &'a Option<$id> {
            fn arg(self) -> Arg<'a> {
                Arg::Text(self.as_deref())
            }
        }
    )*};
}

stored_as_text!(JobId, AttemptId, OwnerId);

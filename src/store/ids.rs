//! The id types ([`JobId`], [`AttemptId`], [`OwnerId`]) as query
//! arguments: each is bound as the text it wraps (a TEXT column on both
//! dialects), so a query binds `&job.id` or `&event.attempt_id` through
//! [`args!`](super::sql::db::args) as it bound the `String` before.

use super::sql::db::{Arg, IntoArg};
use crate::domain::{AttemptId, JobId, OwnerId};

impl<'a> IntoArg<'a> for &'a JobId {
    fn arg(self) -> Arg<'a> {
        Arg::Text(Some(self.as_str()))
    }
}

impl<'a> IntoArg<'a> for &'a Option<JobId> {
    fn arg(self) -> Arg<'a> {
        Arg::Text(self.as_deref())
    }
}

impl<'a> IntoArg<'a> for &'a AttemptId {
    fn arg(self) -> Arg<'a> {
        Arg::Text(Some(self.as_str()))
    }
}

impl<'a> IntoArg<'a> for &'a Option<AttemptId> {
    fn arg(self) -> Arg<'a> {
        Arg::Text(self.as_deref())
    }
}

impl<'a> IntoArg<'a> for &'a OwnerId {
    fn arg(self) -> Arg<'a> {
        Arg::Text(Some(self.as_str()))
    }
}

impl<'a> IntoArg<'a> for &'a Option<OwnerId> {
    fn arg(self) -> Arg<'a> {
        Arg::Text(self.as_deref())
    }
}

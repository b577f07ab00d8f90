//! Reading `job_events` in id order without skipping an event that commits late.
//!
//! Ids are taken at insert, but transactions commit in any order: a reader that saw id 12 may
//! later see 11 appear. A reader keeps a cursor (every id at or below it is done) and reads on
//! only over consecutive ids. At a missing id it waits ("holds"), remembering the highest id it
//! saw then; once the hold is older than the settle time, the ids missing up to that mark are
//! taken as never coming (a rolled-back insert, or an event pruned with its job) and skipped.
//! So delivery is immediate while ids are consecutive, and an event is lost only when its
//! transaction stays open longer than the settle time after a later one committed.

use serde::Serialize;
use sqlx::PgPool;
use time::OffsetDateTime;

use super::super::ops::job_columns;
use super::super::{EngineError, Job, JobState};

/// Where a reader waits at a missing id: since when, and the highest id it had seen then.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hold {
    pub since: OffsetDateTime,
    pub upto: i64,
}

/// How many of `ids` (ascending, all above `cursor`) a reader may take now, and its hold after
/// taking them (`None`: it took them all).
pub fn settled(
    cursor: i64,
    ids: &[i64],
    hold: Option<Hold>,
    now: OffsetDateTime,
    settle: std::time::Duration,
) -> (usize, Option<Hold>) {
    let expired = hold.filter(|h| now - h.since >= settle);
    let skippable = expired.map_or(cursor, |h| h.upto);
    let mut expected = cursor + 1;
    for (n, &id) in ids.iter().enumerate() {
        // the ids expected..id are missing: skipped only if all were already missing at the hold
        if id != expected && id - 1 > skippable {
            let upto = *ids.last().unwrap_or(&id);
            let hold = match hold {
                Some(h) if n == 0 && expired.is_none() => h,
                _ => Hold { since: now, upto },
            };
            return (n, Some(hold));
        }
        expected = id + 1;
    }
    (ids.len(), None)
}

/// One row of the audit trail with the job it belongs to, as it is now (`None`: pruned).
#[derive(Clone, Debug)]
pub struct LoggedEvent {
    pub id: i64,
    pub at: OffsetDateTime,
    pub from_state: Option<JobState>,
    pub to_state: JobState,
    pub step: Option<String>,
    pub detail: Option<String>,
    pub job: Option<Job>,
}

/// A job event as a callback or a stream sends it.
#[derive(Clone, Debug, Serialize)]
pub struct EventSummary {
    /// The job's id.
    pub id: i64,
    pub kind: String,
    pub subject: String,
    pub tenant: String,
    /// The state the job entered with this event.
    pub state: JobState,
    pub previous_state: Option<JobState>,
    pub step: Option<String>,
    /// Why (an error, an approval's reason, a cancellation's reason), when the event says.
    pub detail: Option<String>,
    /// The job's last error as it is now.
    pub last_error: Option<String>,
    /// The job's state as it is now.
    pub current_state: JobState,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    /// The event's id in the audit trail (also the callback's `webhook-id`, `evt_<id>`).
    pub event_id: i64,
}

impl LoggedEvent {
    pub fn summary(&self) -> Option<EventSummary> {
        let j = self.job.as_ref()?;
        Some(EventSummary {
            id: j.id,
            kind: j.kind.clone(),
            subject: j.subject.clone(),
            tenant: j.tenant.clone(),
            state: self.to_state,
            previous_state: self.from_state,
            step: self.step.clone(),
            detail: self.detail.clone(),
            last_error: j.last_error.clone(),
            current_state: j.state,
            at: self.at,
            created_at: j.created_at,
            finished_at: j.finished_at,
            event_id: self.id,
        })
    }
}

#[derive(sqlx::FromRow)]
struct EventRow {
    ev_id: i64,
    ev_at: OffsetDateTime,
    ev_from: Option<JobState>,
    ev_to: JobState,
    ev_step: Option<String>,
    ev_detail: Option<String>,
    job_found: bool,
}

/// The events with ids in `(after, upto]` (or all after `after`), oldest first, at most `limit`;
/// `newest_first` takes the newest `limit` of them instead (still returned oldest first).
pub async fn read(
    pool: &PgPool,
    after: i64,
    upto: Option<i64>,
    limit: i64,
    newest_first: bool,
) -> Result<Vec<LoggedEvent>, EngineError> {
    let cols = job_columns("j.");
    let order = if newest_first { "desc" } else { "asc" };
    let rows: Vec<sqlx::postgres::PgRow> = sqlx::query(&format!(
        "select e.id as ev_id, e.at as ev_at, e.from_state as ev_from, e.to_state as ev_to, e.step as ev_step,
                e.detail as ev_detail, j.id is not null as job_found, {cols}
         from job_events e left join jobs j on j.id = e.job_id
         where e.id > $1 and ($2::bigint is null or e.id <= $2)
         order by e.id {order} limit $3"
    ))
    .bind(after)
    .bind(upto)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    let mut out = Vec::with_capacity(rows.len());
    for row in &rows {
        use sqlx::FromRow;
        let e = EventRow::from_row(row)?;
        let job = if e.job_found { Some(Job::from_row(row)?) } else { None };
        out.push(LoggedEvent {
            id: e.ev_id,
            at: e.ev_at,
            from_state: e.ev_from,
            to_state: e.ev_to,
            step: e.ev_step,
            detail: e.ev_detail,
            job,
        });
    }
    if newest_first {
        out.reverse();
    }
    Ok(out)
}

/// The newest event's id (0 when there is none).
pub async fn last_id(pool: &PgPool) -> Result<i64, EngineError> {
    Ok(sqlx::query_scalar("select coalesce(max(id), 0)::bigint from job_events").fetch_one(pool).await?)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const SETTLE: Duration = Duration::from_secs(30);

    fn at(s: i64) -> OffsetDateTime {
        OffsetDateTime::UNIX_EPOCH + time::Duration::seconds(s)
    }

    #[test]
    fn consecutive_ids_go_at_once() {
        assert_eq!(settled(10, &[11, 12, 13], None, at(0), SETTLE), (3, None));
        assert_eq!(settled(10, &[], None, at(0), SETTLE), (0, None));
    }

    #[test]
    fn a_missing_id_holds_until_the_settle_time_then_is_skipped() {
        // 12 is missing: 11 goes, the reader holds at 12 having seen up to 14
        let (n, hold) = settled(10, &[11, 13, 14], None, at(0), SETTLE);
        assert_eq!((n, hold), (1, Some(Hold { since: at(0), upto: 14 })));
        // still missing, settle time not over: nothing more, the hold is kept
        assert_eq!(settled(11, &[13, 14, 15], hold, at(10), SETTLE), (0, hold));
        // 12 commits late: it goes with the rest
        assert_eq!(settled(11, &[12, 13, 14, 15], hold, at(10), SETTLE), (4, None));
        // never came: after the settle time it is skipped
        assert_eq!(settled(11, &[13, 14, 15], hold, at(30), SETTLE), (3, None));
    }

    #[test]
    fn only_ids_missing_at_the_hold_are_skipped() {
        let hold = Some(Hold { since: at(0), upto: 14 });
        // 16 went missing after the hold began: it gets its own settle time
        let (n, h) = settled(11, &[13, 14, 15, 17], hold, at(31), SETTLE);
        assert_eq!((n, h), (3, Some(Hold { since: at(31), upto: 17 })));
    }
}

//! Retention: finished jobs (succeeded, cancelled), with their step attempts and audit trail,
//! are deleted once they finished longer ago than a setting, a batch at a time. Failed jobs are
//! kept: one holds its subject until a person retries or cancels it, and pruning it would let the
//! work queued behind it go ahead without that decision. Safe with
//! several replicas pruning at once: each batch skips rows another has locked.

use std::time::Duration;

use super::{Engine, EngineError};

/// What one batch deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pruned {
    pub jobs: u64,
    pub step_runs: u64,
    pub job_events: u64,
}

impl Engine {
    /// Deletes up to `batch` jobs that finished more than `older_than` ago, with their step runs
    /// and events, in one statement. Unfinished jobs are never touched (a retried job is
    /// unfinished again). `older_than` should outlive anything that still points at a job (an
    /// API idempotency key answers for 24 hours).
    pub async fn prune_jobs(&self, older_than: Duration, batch: u32) -> Result<Pruned, EngineError> {
        let (jobs, step_runs, job_events): (i64, i64, i64) = sqlx::query_as(
            "with doomed as (
               select id from jobs
               where queue_state in ('succeeded', 'cancelled')
                 and finished_at < now() - $1 * interval '1 second'
               order by finished_at
               limit $2
               for update skip locked),
             sr as (delete from step_runs where job_id in (select id from doomed) returning 1),
             ev as (delete from job_events where job_id in (select id from doomed) returning 1),
             mk as (delete from step_marks where job_id in (select id from doomed)),
             j as (delete from jobs where id in (select id from doomed) returning 1)
             select (select count(*) from j), (select count(*) from sr), (select count(*) from ev)",
        )
        .bind(older_than.as_secs_f64())
        .bind(i64::from(batch))
        .fetch_one(self.pool())
        .await?;
        let n = |v: i64| u64::try_from(v).unwrap_or_default();
        Ok(Pruned { jobs: n(jobs), step_runs: n(step_runs), job_events: n(job_events) })
    }
}

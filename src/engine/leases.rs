//! Leases of running steps: renewed while a worker runs them, given back at shutdown.

use std::time::Duration;

use sqlx::{PgPool, Row};

use super::EngineError;
use super::store::NOTIFY_JOBS;

/// Extends the leases of steps this worker is running; returns the ids it no longer holds
/// (cancelled, finished elsewhere, or taken over after the lease expired).
pub(crate) async fn renew(
    pool: &PgPool,
    owner: &str,
    lease: Duration,
    held: &[(i64, i32, i32)],
) -> Result<Vec<i64>, EngineError> {
    // in id order, as `store::write_results` locks them
    let mut held = held.to_vec();
    held.sort_unstable();
    let ids = sqlx::query_scalar(
        "with v as (select * from unnest($3::bigint[], $4::int[], $5::int[]) v(id, step_index, attempt)),
         upd as (
           -- no indexed column changes: a HOT update (migration 0027)
           update jobs j set lease_until = now() + $2 * interval '1 millisecond'
           from v where j.id = v.id and j.step_index = v.step_index and j.attempt = v.attempt
             and j.lease_owner = $1)
         -- a job that moved on to its next step in this worker is still held
         select v.id from v left join jobs j on j.id = v.id
         where j.id is null or j.state <> 'running' or j.lease_owner is distinct from $1",
    )
    .bind(owner)
    .bind(lease.as_millis() as i64)
    .bind(held.iter().map(|h| h.0).collect::<Vec<_>>())
    .bind(held.iter().map(|h| h.1).collect::<Vec<_>>())
    .bind(held.iter().map(|h| h.2).collect::<Vec<_>>())
    .fetch_all(pool)
    .await?;
    Ok(ids)
}

/// Gives steps back at shutdown: they become due at once for any worker.
pub(crate) async fn release(pool: &PgPool, owner: &str, held: &[(i64, i32, i32)]) -> Result<u64, EngineError> {
    // `o`: the row as this statement found it, with the attempt that ends here
    let ended = "select o.run_id, r.id as job_id, r.step_index, r.step, r.attempt, $1 as worker,
                        o.run_started_at as started_at from r join jobs o on o.id = r.id";
    let done = sqlx::query(&format!(
        "with v as (select * from unnest($2::bigint[], $3::int[], $4::int[]) v(id, step_index, attempt)),
         r as (
           update jobs j set queue_state = 'pending', run_at = now(), lease_owner = null, lease_until = null,
                  run_id = null, run_started_at = null, updated_at = now()
           from v where j.id = v.id and j.step_index = v.step_index and j.attempt = v.attempt
             and j.lease_owner = $1
           returning j.id, j.step_index, j.attempt, j.step),
         s as ({}),
         ev as (
           insert into job_events (job_id, from_state, to_state, step, actor, detail)
           select id, 'running', 'pending', step, 'worker:' || $1, 'released at shutdown' from r)
         select count(*), (select 1 from (select pg_notify($5, '')) n) as woke from r",
        super::attempts::end_open(ended, "'released'", "'the worker shut down before the step finished'")
    ))
    .bind(owner)
    .bind(held.iter().map(|h| h.0).collect::<Vec<_>>())
    .bind(held.iter().map(|h| h.1).collect::<Vec<_>>())
    .bind(held.iter().map(|h| h.2).collect::<Vec<_>>())
    .bind(NOTIFY_JOBS)
    .fetch_one(pool)
    .await?;
    Ok(done.try_get::<i64, _>(0)? as u64)
}

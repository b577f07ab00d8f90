//! A job's attempts. An attempt opens in its job's row when a worker claims it (`run_id`,
//! `run_started_at`, the lease) and gets its own row in `step_runs` once, when it ends: with its
//! result (`store::write_results`), when its lease expired (`store::claim`), when its worker gave
//! it back (`leases::release`) or when the job was cancelled (`ops::cancel`). Migration 0028.

use sqlx::PgPool;

use super::{EngineError, StepRun};

/// An insert of the rows of the attempts that `source` ends, with `outcome` and `error` (SQL
/// expressions). `source` is a query of open attempts with the columns `run_id`, `job_id`,
/// `step_index`, `step`, `attempt`, `worker` and `started_at`. An attempt opened by an earlier
/// version already has its row, which is ended instead.
pub(super) fn end_open(source: &str, outcome: &str, error: &str) -> String {
    format!(
        "insert into step_runs (id, job_id, step_index, step, attempt, worker, started_at, finished_at, outcome, error)
         overriding system value
         select coalesce(a.run_id, nextval('step_runs_id_seq')), a.job_id, a.step_index, a.step, a.attempt, a.worker,
                coalesce(a.started_at, now()), now(), {outcome}, {error}
         from ({source}) a
         on conflict (job_id, step_index, attempt) do update
           set finished_at = excluded.finished_at, outcome = excluded.outcome, error = excluded.error
           where step_runs.finished_at is null"
    )
}

/// A job's attempts, oldest first: the ended ones' rows and the open one from the job's row.
pub(super) async fn list(pool: &PgPool, id: i64) -> Result<Vec<StepRun>, EngineError> {
    Ok(sqlx::query_as(
        "select id, job_id, step_index, step, attempt, worker, started_at, finished_at, outcome, error, output,
                next_run_at, effects
         from step_runs where job_id = $1
         union all
         select j.run_id, j.id, j.step_index, j.step, j.attempt, j.lease_owner, j.run_started_at, null, null, null,
                null, null, null
         from jobs j
         where j.id = $1 and j.lease_owner is not null and j.run_id is not null
           and not exists (select 1 from step_runs s
                           where s.job_id = j.id and s.step_index = j.step_index and s.attempt = j.attempt)
         order by id",
    )
    .bind(id)
    .fetch_all(pool)
    .await?)
}

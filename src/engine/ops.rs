//! What people do to jobs (cancel, retry, approve) and how they read them.

use sqlx::{PgPool, Postgres, Transaction};
use time::OffsetDateTime;

use super::store::{NOTIFY_CANCEL, NOTIFY_JOBS};
use super::{Actor, EngineError, Job, JobEvent, JobState, StepRun};

/// The columns of a [`Job`] from `jobs` (as `t`, e.g. `j.`, or `""`). While a worker holds the
/// job's lease, its `run_at` is when the lease expires.
pub(super) fn job_columns(t: &str) -> String {
    format!(
        "{t}id, {t}kind, {t}subject, {t}tenant, {t}dedupe_key, {t}state, {t}input, {t}outputs, {t}step_index,
         {t}step, {t}attempt, case when {t}lease_owner is null then {t}run_at else {t}lease_until end as run_at,
         {t}lease_owner, {t}poll_deadline, {t}approved_by, {t}last_error, {t}created_by, {t}created_at,
         {t}updated_at, {t}finished_at"
    )
}

/// Locks the job and checks that `action` may act on its state.
async fn lock(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    action: &'static str,
    allowed: &[JobState],
) -> Result<(JobState, String), EngineError> {
    let row: Option<(JobState, String)> = sqlx::query_as("select state, step from jobs where id = $1 for update")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    let (state, step) = row.ok_or(EngineError::NotFound(id))?;
    if !allowed.contains(&state) {
        return Err(EngineError::InvalidState { id, state, action });
    }
    Ok((state, step))
}

async fn record(
    tx: &mut Transaction<'_, Postgres>,
    id: i64,
    from: JobState,
    to: JobState,
    step: &str,
    actor: &Actor,
    detail: Option<&str>,
) -> Result<(), EngineError> {
    sqlx::query(
        "insert into job_events (job_id, from_state, to_state, step, actor, detail) values ($1, $2, $3, $4, $5, $6)",
    )
    .bind(id)
    .bind(from)
    .bind(to)
    .bind(step)
    .bind(actor.as_str())
    .bind(detail)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn notify(tx: &mut Transaction<'_, Postgres>, channel: &str, payload: &str) -> Result<(), EngineError> {
    sqlx::query("select pg_notify($1, $2)").bind(channel).bind(payload).execute(&mut **tx).await?;
    Ok(())
}

/// Cancels an unfinished job. A step that is running is told to stop, and its result is refused.
pub async fn cancel(pool: &PgPool, id: i64, actor: &Actor, reason: Option<&str>) -> Result<Job, EngineError> {
    use JobState::*;
    let mut tx = pool.begin().await?;
    let (from, step) = lock(&mut tx, id, "cancel", &[Pending, Running, Waiting, NeedsApproval, Failed]).await?;
    // the running attempt (open in the job's row) ends here, before the row forgets it
    let open =
        "select run_id, id as job_id, step_index, step, attempt, lease_owner as worker, run_started_at as started_at
                from jobs where id = $1 and lease_owner is not null";
    sqlx::query(&super::attempts::end_open(open, "'cancelled'", "$2"))
        .bind(id)
        .bind(format!("cancelled by {actor}"))
        .execute(&mut *tx)
        .await?;
    sqlx::query(
        "update jobs set queue_state = 'cancelled', lease_owner = null, lease_until = null, run_id = null,
                run_started_at = null, finished_at = now(), updated_at = now()
         where id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    record(&mut tx, id, from, Cancelled, &step, actor, reason).await?;
    notify(&mut tx, NOTIFY_CANCEL, &id.to_string()).await?;
    // its successors on the same subject may run now
    notify(&mut tx, NOTIFY_JOBS, "").await?;
    commit_returning(tx, id).await
}

/// Runs a failed job again from the step that failed, with a fresh retry budget.
/// Steps that were done are not run again.
pub async fn retry(pool: &PgPool, id: i64, actor: &Actor) -> Result<Job, EngineError> {
    let mut tx = pool.begin().await?;
    let (from, step) = lock(&mut tx, id, "retry", &[JobState::Failed]).await?;
    sqlx::query(
        "update jobs set queue_state = 'pending', run_at = now(), attempt_floor = attempt, finished_at = null,
                poll_deadline = null, updated_at = now()
         where id = $1",
    )
    .bind(id)
    .execute(&mut *tx)
    .await?;
    record(&mut tx, id, from, JobState::Pending, &step, actor, Some("retry from the failed step")).await?;
    notify(&mut tx, NOTIFY_JOBS, "").await?;
    commit_returning(tx, id).await
}

/// Approves the step that is waiting for approval; it runs again knowing it was approved.
/// A four-eyes step (see [`super::Flow::four_eyes`]) is refused to the job's starter; its audit
/// entry names both the approver and the starter.
pub async fn approve(pool: &PgPool, id: i64, actor: &Actor) -> Result<Job, EngineError> {
    let mut tx = pool.begin().await?;
    let (from, step) = lock(&mut tx, id, "approve", &[JobState::NeedsApproval]).await?;
    let (four_eyes, starter): (bool, String) =
        sqlx::query_as("select four_eyes_step is not distinct from step_index, created_by from jobs where id = $1")
            .bind(id)
            .fetch_one(&mut *tx)
            .await?;
    if four_eyes && starter == actor.as_str() {
        return Err(EngineError::FourEyes { id, step, starter });
    }
    sqlx::query(
        "update jobs set queue_state = 'pending', run_at = now(), approved_step = step_index, approved_by = $2,
                updated_at = now()
         where id = $1",
    )
    .bind(id)
    .bind(actor.as_str())
    .execute(&mut *tx)
    .await?;
    let detail = match four_eyes {
        true => format!("approved by {actor} (four eyes: the job was started by {starter})"),
        false => "approved".to_string(),
    };
    record(&mut tx, id, from, JobState::Pending, &step, actor, Some(&detail)).await?;
    notify(&mut tx, NOTIFY_JOBS, "").await?;
    commit_returning(tx, id).await
}

/// Marks the step a worker runs (fenced by its attempt) as one whose approval needs four eyes,
/// before the worker writes that the step needs approval.
pub(super) async fn mark_four_eyes(pool: &PgPool, id: i64, step_index: i32, attempt: i32) -> Result<(), EngineError> {
    sqlx::query(
        "update jobs set four_eyes_step = step_index
         where id = $1 and step_index = $2 and attempt = $3 and state = 'running'",
    )
    .bind(id)
    .bind(step_index)
    .bind(attempt)
    .execute(pool)
    .await?;
    Ok(())
}

/// Commits and returns the job as this transaction left it (a worker may change it right after).
async fn commit_returning(mut tx: Transaction<'_, Postgres>, id: i64) -> Result<Job, EngineError> {
    let job = sqlx::query_as(&format!("select {} from jobs where id = $1", job_columns("")))
        .bind(id)
        .fetch_one(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(job)
}

pub async fn job(pool: &PgPool, id: i64) -> Result<Job, EngineError> {
    sqlx::query_as(&format!("select {} from jobs where id = $1", job_columns("")))
        .bind(id)
        .fetch_optional(pool)
        .await?
        .ok_or(EngineError::NotFound(id))
}

/// Which jobs to list; all fields optional. Pages go from newest to oldest.
#[derive(Clone, Debug, Default)]
pub struct JobFilter {
    pub state: Option<JobState>,
    pub kind: Option<String>,
    /// Exact subject, or a prefix ending in `/` (e.g. `foo/`).
    pub subject: Option<String>,
    /// Only jobs of this tenant (the first segment of the subject).
    pub tenant: Option<String>,
    pub created_since: Option<OffsetDateTime>,
    /// Keyset cursor: only jobs with a smaller id.
    pub before_id: Option<i64>,
    pub limit: u32,
    /// Leave out jobs whose kind starts with this (e.g. kinds only some callers may see).
    pub hide_kinds_starting: Option<String>,
}

pub async fn list(pool: &PgPool, f: &JobFilter) -> Result<Vec<Job>, EngineError> {
    let (exact, prefix) = match f.subject.as_deref() {
        Some(s) if s.ends_with('/') => (None, Some(format!("{}%", s.replace('%', "\\%").replace('_', "\\_")))),
        other => (other, None),
    };
    let rows = sqlx::query_as(&format!(
        "select {} from jobs
         where ($1::text is null or state = $1) and ($2::text is null or kind = $2)
           and ($3::text is null or subject = $3) and ($4::text is null or subject like $4)
           and ($5::timestamptz is null or created_at >= $5) and ($6::bigint is null or id < $6)
           and ($8::text is null or tenant = $8)
           and ($9::text is null or left(kind, length($9)) <> $9)
         order by id desc limit $7",
        job_columns("")
    ))
    .bind(f.state)
    .bind(f.kind.as_deref())
    .bind(exact)
    .bind(prefix)
    .bind(f.created_since)
    .bind(f.before_id)
    .bind(i64::from(f.limit.clamp(1, 500)))
    .bind(f.tenant.as_deref())
    .bind(f.hide_kinds_starting.as_deref())
    .fetch_all(pool)
    .await?;
    Ok(rows)
}

pub async fn step_runs(pool: &PgPool, id: i64) -> Result<Vec<StepRun>, EngineError> {
    super::attempts::list(pool, id).await
}

pub async fn events(pool: &PgPool, id: i64) -> Result<Vec<JobEvent>, EngineError> {
    Ok(sqlx::query_as("select * from job_events where job_id = $1 order by id").bind(id).fetch_all(pool).await?)
}

//! The engine's hot path in SQL: enqueue, claim, write results, renew and release leases.
//! Each function is one round trip (or one short transaction) over any number of jobs, so that
//! many concurrent steps share statements and commits.

use std::sync::LazyLock;
use std::time::Duration;

use serde_json::{Map, Value};
use sqlx::{PgConnection, PgExecutor, PgPool, Row};
use time::OffsetDateTime;

use super::{Actor, EngineError, JobState, Registry, StepOutcome};

pub(crate) const NOTIFY_JOBS: &str = "onramp_jobs";
pub(crate) const NOTIFY_CANCEL: &str = "onramp_cancel";

/// A job to create.
#[derive(Clone, Debug)]
pub struct NewJob {
    pub kind: String,
    pub subject: String,
    /// While an unfinished job has this key, enqueueing returns that job instead.
    pub dedupe_key: Option<String>,
    pub input: Value,
    /// Not before this moment; now when absent.
    pub run_at: Option<OffsetDateTime>,
    pub actor: Actor,
    /// The trace context of the span the job was created in (see [`super::trace`]); its steps'
    /// spans join that trace.
    pub traceparent: Option<String>,
}

impl NewJob {
    pub fn new(kind: &str, subject: &str, input: Value, actor: Actor) -> Self {
        let traceparent = super::trace::current();
        Self { kind: kind.into(), subject: subject.into(), dedupe_key: None, input, run_at: None, actor, traceparent }
    }
    pub fn dedupe(mut self, key: impl Into<String>) -> Self {
        self.dedupe_key = Some(key.into());
        self
    }
    pub fn at(mut self, run_at: OffsetDateTime) -> Self {
        self.run_at = Some(run_at);
        self
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Enqueued {
    pub id: i64,
    /// False when an unfinished job with the same dedupe key was returned instead.
    pub created: bool,
}

/// Creates jobs inside the caller's transaction (so a webhook delivery and the jobs it causes
/// commit together). Jobs of one subject are serialized by an advisory lock held to commit, so
/// their ids follow commit order and the oldest unfinished one always runs first.
pub async fn enqueue(
    conn: &mut PgConnection,
    registry: &Registry,
    jobs: &[NewJob],
) -> Result<Vec<Enqueued>, EngineError> {
    if jobs.is_empty() {
        return Ok(vec![]);
    }
    let mut first_steps = Vec::with_capacity(jobs.len());
    for j in jobs {
        let steps = registry.steps(&j.kind).ok_or_else(|| EngineError::UnknownKind(j.kind.clone()))?;
        first_steps.push(steps[0]);
    }
    let subjects: Vec<&str> = jobs.iter().map(|j| j.subject.as_str()).collect();
    sqlx::query(
        "select pg_advisory_xact_lock(h) from
           (select distinct hashtextextended(s, 7) as h from unnest($1::text[]) s) x order by h",
    )
    .bind(&subjects)
    .execute(&mut *conn)
    .await?;
    // One statement: number the rows (after the lock, so ids follow commit order per subject),
    // insert those whose dedupe key is free, audit them, and wake the workers. The sequence is
    // named, not looked up per row (`pg_get_serial_sequence` cost 4 µs a job).
    let rows: Vec<(i64, bool)> = sqlx::query_as(
        "with v as materialized (
           select nextval('jobs_id_seq') as id, *
           from unnest($1::text[], $2::text[], $3::text[], $4::jsonb[], $5::text[], $6::timestamptz[], $7::text[],
                       $9::text[])
                with ordinality as v(kind, subject, dedupe_key, input, step, run_at, actor, traceparent, ord)),
         ins as (
           insert into jobs (id, kind, subject, dedupe_key, input, step, run_at, created_by, traceparent)
           select id, kind, subject, dedupe_key, input, step, coalesce(run_at, now()), actor, traceparent
           from v order by ord
           on conflict (dedupe_key) where dedupe_key is not null and queue_state not in ('succeeded', 'cancelled')
           do nothing
           returning id, step, created_by, run_at),
         ev as (
           insert into job_events (job_id, to_state, step, actor, detail)
           select id, 'pending', step, created_by,
                  case when run_at > now() then 'scheduled for ' || run_at::text end from ins)
         -- wake idle workers only for work due now: a NOTIFY serializes concurrent commits, and a
         -- worker finds jobs due later by its next-due timer or its poll
         select v.id, exists (select 1 from ins where ins.id = v.id) as created,
                case when exists (select 1 from ins where ins.run_at <= now())
                     then (select 1 from (select pg_notify($8, '')) n) end as woke
         from v order by v.ord",
    )
    .bind(jobs.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>())
    .bind(&subjects)
    .bind(jobs.iter().map(|j| j.dedupe_key.as_deref()).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| &j.input).collect::<Vec<_>>())
    .bind(&first_steps)
    .bind(jobs.iter().map(|j| j.run_at).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.actor.as_str()).collect::<Vec<_>>())
    .bind(NOTIFY_JOBS)
    .bind(jobs.iter().map(|j| j.traceparent.as_deref()).collect::<Vec<_>>())
    .fetch_all(&mut *conn)
    .await?;

    let mut out = Vec::with_capacity(jobs.len());
    for (job, (id, created)) in jobs.iter().zip(rows) {
        if created {
            out.push(Enqueued { id, created });
            continue;
        }
        // Not inserted: an unfinished job holds the dedupe key (perhaps one of this batch).
        let key = job.dedupe_key.as_deref().expect("only a dedupe conflict skips a row");
        let existing: i64 = sqlx::query_scalar(
            "select id from jobs where dedupe_key = $1 and queue_state not in ('succeeded', 'cancelled')",
        )
        .bind(key)
        .fetch_one(&mut *conn)
        .await?;
        out.push(Enqueued { id: existing, created: false });
    }
    Ok(out)
}

/// A step a worker has claimed, with everything needed to run it.
#[derive(Clone, Debug)]
pub(crate) struct Claimed {
    pub id: i64,
    pub kind: String,
    pub subject: String,
    /// The subject's first segment.
    pub tenant: String,
    /// Where the job's steps' spans belong (see [`super::trace`]).
    pub traceparent: Option<String>,
    pub created_at: OffsetDateTime,
    pub input: Value,
    pub outputs: Map<String, Value>,
    pub step_index: i32,
    pub attempt: i32,
    pub attempt_floor: i32,
    pub step_waited: bool,
    pub poll_deadline: Option<OffsetDateTime>,
    pub approved_by: Option<String>,
}

/// The claim's statement, with the rows of the attempts whose lease expired (see [`super::attempts`]).
static CLAIM: LazyLock<String> = LazyLock::new(|| {
    let lost = "select c.old_run_id as run_id, c.id as job_id, c.step_index, c.step, c.old_attempt as attempt,
                       coalesce(c.old_owner, '?') as worker, c.old_run_started_at as started_at
                from claimed c where c.old_state = 'running'";
    format!(
        "with cand as (select * from onramp_claim_candidates($1, $4)),
         claimed as (
           -- no indexed column changes: a HOT update (migration 0027)
           -- the attempt opens in the job's row; its own row is written when it ends (migration 0028).
           -- The clock, not now() (when the statement began, which can be before the commit of a
           -- result this claim saw): a subject's next step never seems to start before the last ended
           update jobs j set attempt = j.attempt + 1, lease_owner = $2,
                  lease_until = now() + $3 * interval '1 millisecond', updated_at = now(),
                  run_id = nextval('step_runs_id_seq'), run_started_at = clock_timestamp()
           -- by primary key, whatever the plan guesses of cand's size (a guess of a tenth of the
           -- table once hash-joined the whole of it)
           from cand where j.id = cand.id and j.id = any(array(select id from cand))
           returning j.id, j.kind, j.subject, j.tenant, j.traceparent, j.created_at, j.input, j.outputs, j.step_index, j.step, j.attempt,
                     j.attempt_floor, j.step_waited, j.poll_deadline, j.approved_step, j.approved_by,
                     cand.old_state, cand.old_attempt, cand.old_owner, cand.old_run_id, cand.old_run_started_at),
         lost as ({}),
         ev as (
           insert into job_events (job_id, from_state, to_state, step, actor, detail)
           select id, old_state, 'running', step, 'worker:' || $2,
                  case when old_state = 'running' then 'reclaimed: the lease of ' || coalesce(old_owner, '?') || ' expired' end
           from claimed)
         select id, kind, subject, tenant, traceparent, created_at, input, outputs, step_index, attempt, attempt_floor, step_waited,
                poll_deadline, case when approved_step = step_index then approved_by end as approved_by
         from claimed",
        super::attempts::end_open(lost, "'lease_expired'", "'worker ' || a.worker || ' stopped renewing its lease'")
    )
});

/// Claims up to `limit` due steps: pending or waiting jobs whose time has come, and running jobs
/// whose lease expired (their worker died). A job waits while an older unfinished job of the same
/// subject exists. The claim commits before any step runs.
pub(crate) async fn claim(
    conn: &mut PgConnection,
    owner: &str,
    lease: Duration,
    kinds: &[&str],
    limit: usize,
) -> Result<Vec<Claimed>, EngineError> {
    let rows = sqlx::query(&CLAIM)
        .bind(limit as i64)
        .bind(owner)
        .bind(lease.as_millis() as i64)
        .bind(kinds)
        .fetch_all(conn)
        .await?;
    rows.into_iter()
        .map(|r| {
            let outputs = match r.try_get::<Value, _>("outputs")? {
                Value::Object(m) => m,
                _ => Map::new(),
            };
            Ok(Claimed {
                id: r.try_get("id")?,
                kind: r.try_get("kind")?,
                subject: r.try_get("subject")?,
                tenant: r.try_get("tenant")?,
                traceparent: r.try_get("traceparent")?,
                created_at: r.try_get("created_at")?,
                input: r.try_get("input")?,
                outputs,
                step_index: r.try_get("step_index")?,
                attempt: r.try_get("attempt")?,
                attempt_floor: r.try_get("attempt_floor")?,
                step_waited: r.try_get("step_waited")?,
                poll_deadline: r.try_get("poll_deadline")?,
                approved_by: r.try_get("approved_by")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Into::into)
}

/// The result of one attempt, as the worker decided it.
#[derive(Clone, Debug)]
pub struct StepWrite {
    pub id: i64,
    pub step_index: i32,
    pub attempt: i32,
    pub step: &'static str,
    pub outcome: StepOutcome,
    pub new_state: JobState,
    pub new_step_index: i32,
    pub new_step: &'static str,
    /// From now until the job is due again (for `running`: the new lease).
    pub delay: Duration,
    pub poll_for: Duration,
    pub error: Option<String>,
    pub output: Option<Value>,
    /// The commands and requests the attempt made (a JSON array), if any.
    pub effects: Option<Value>,
}

/// Writes results of many attempts in one statement. Each write is fenced by the attempt it
/// belongs to: a worker that lost its lease (or a cancelled job) has its write rejected.
/// Returns the ids whose write was accepted.
pub async fn write_results(
    db: impl PgExecutor<'_>,
    owner: &str,
    writes: &[StepWrite],
) -> Result<Vec<i64>, EngineError> {
    // in id order, as `leases::renew` locks them: two statements that lock the same rows in one order
    // do not deadlock
    let mut writes: Vec<&StepWrite> = writes.iter().collect();
    writes.sort_by_key(|w| w.id);
    let closes = writes.iter().any(|w| matches!(w.new_state, JobState::Succeeded | JobState::Failed));
    let ids = sqlx::query_scalar(
        "with v as (
           select * from unnest($2::bigint[], $3::int[], $4::int[], $5::text[], $6::text[], $7::int[],
                                $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::jsonb[], $13::text[],
                                $16::jsonb[])
             as v(id, step_index, attempt, outcome, new_state, new_step_index, new_step, delay_ms,
                  poll_for_ms, error, output, step, effects)),
         upd as (
           update jobs j set
             -- a step that continues in the same lease keeps the state it was claimed from
             queue_state = case when v.new_state = 'running' then j.queue_state else v.new_state end,
             step_index = v.new_step_index,
             step = v.new_step,
             attempt = case when v.new_step_index = j.step_index then j.attempt
                            when v.new_state = 'running' then 1 else 0 end,
             attempt_floor = case when v.new_step_index = j.step_index then j.attempt_floor else 0 end,
             step_waited = v.new_step_index = j.step_index and (j.step_waited or v.outcome = 'wait'),
             poll_deadline = case
               when v.outcome = 'poll' then coalesce(j.poll_deadline, now() + v.poll_for_ms * interval '1 millisecond')
               when v.new_step_index = j.step_index then j.poll_deadline end,
             run_at = case
               when v.new_state = 'running' then j.run_at
               when v.outcome = 'poll' then least(now() + v.delay_ms * interval '1 millisecond',
                                                  coalesce(j.poll_deadline, now() + v.poll_for_ms * interval '1 millisecond'))
               else now() + v.delay_ms * interval '1 millisecond' end,
             lease_owner = case when v.new_state = 'running' then j.lease_owner end,
             lease_until = case when v.new_state = 'running' then now() + v.delay_ms * interval '1 millisecond' end,
             outputs = case when v.outcome = 'done' then j.outputs || jsonb_build_object(v.step, v.output)
                            else j.outputs end,
             approved_step = case when v.new_step_index = j.step_index then j.approved_step end,
             approved_by = case when v.new_step_index = j.step_index then j.approved_by end,
             last_error = case when v.error is not null then v.error
                               when v.new_step_index = j.step_index then j.last_error end,
             finished_at = case when v.new_state in ('succeeded', 'failed') then now() end,
             -- the next step's attempt opens in the same lease (see the claim)
             run_id = case when v.new_state = 'running' then nextval('step_runs_id_seq') end,
             run_started_at = case when v.new_state = 'running' then clock_timestamp() end,
             updated_at = now()
           -- `o`: the row as this statement found it, with the attempt that ends here
           from v join jobs o on o.id = v.id
           where j.id = v.id and j.step_index = v.step_index and j.attempt = v.attempt
             and j.lease_owner = $1
           returning j.id, j.run_at, o.run_id as ended_run_id, o.run_started_at as ended_started_at),
         -- the ended attempt's row, written once (migration 0028); the fence above admits one
         -- write per attempt
         fin as (
           insert into step_runs (id, job_id, step_index, step, attempt, worker, started_at, finished_at, outcome,
                                  error, output, effects, next_run_at)
           overriding system value
           select coalesce(u.ended_run_id, nextval('step_runs_id_seq')), v.id, v.step_index, v.step, v.attempt, $1,
                  coalesce(u.ended_started_at, now()), now(), v.outcome, v.error, v.output, v.effects,
                  case when v.new_state in ('pending', 'waiting') then u.run_at end
           from v join upd u on u.id = v.id),
         ev as (
           insert into job_events (job_id, from_state, to_state, step, actor, detail)
           select v.id, 'running', v.new_state, v.step, 'worker:' || $1, v.error
           from v join upd u on u.id = v.id where v.new_state <> 'running')
         -- an uncorrelated subquery runs once: wake peers when jobs closed (successors may be due)
         select u.id, case when $15 then (select 1 from (select pg_notify($14, '')) n) end as woke
         from upd u",
    )
    .bind(owner)
    .bind(writes.iter().map(|w| w.id).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.step_index).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.attempt).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.outcome).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.new_state).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.new_step_index).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.new_step).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.delay.as_millis() as i64).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.poll_for.as_millis() as i64).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.error.as_deref()).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.output.as_ref()).collect::<Vec<_>>())
    .bind(writes.iter().map(|w| w.step).collect::<Vec<_>>())
    .bind(NOTIFY_JOBS)
    .bind(closes)
    .bind(writes.iter().map(|w| w.effects.as_ref()).collect::<Vec<_>>())
    .fetch_all(db)
    .await?;
    Ok(ids)
}

/// The next moment something becomes due in the future (a timer, a backoff, a lease expiry).
/// How long until the next timer, counting those that came due since `claimed_at` (the start of
/// the claim that found nothing more: 0, claim again). Jobs due before it that the claim left
/// (their subject is busy) are not counted, so they cause no busy loop.
pub(crate) async fn next_due(pool: &PgPool, claimed_at: OffsetDateTime) -> Result<Option<Duration>, EngineError> {
    // A leased job's `run_at` has passed (it was due when claimed), so its lease's end is found
    // among the due jobs at the front of `jobs_due`; the rest are due later, in `run_at` order.
    let ms: Option<f64> = sqlx::query_scalar(
        "select (extract(epoch from least(
           (select min(run_at) from jobs
            where queue_state in ('pending', 'waiting') and run_at > least($1, now()) and lease_owner is null),
           (select min(lease_until) from jobs
            where queue_state in ('pending', 'waiting') and run_at <= now() and lease_owner is not null
              and lease_until > least($1, now()))) - now()) * 1000)::float8",
    )
    .bind(claimed_at)
    .fetch_one(pool)
    .await?;
    Ok(ms.map(|m| Duration::from_millis(m.max(0.0) as u64)))
}

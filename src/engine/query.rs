//! Questions the rest of the service asks about jobs, answered with plain types so that nothing
//! outside the engine reads its tables. Kinds and output paths come from the caller: the engine
//! knows no flow by name.

use std::collections::HashMap;

use serde_json::Value;
use sqlx::{Connection, PgConnection, PgPool};
use time::OffsetDateTime;

use super::ops::job_columns;
use super::{EngineError, Job, JobState};

/// An array of objects in the outputs of succeeded jobs, e.g. a report's per-tenant entries.
#[derive(Clone, Copy, Debug)]
pub struct OutputArray<'a> {
    /// The kinds of job whose outputs hold the array.
    pub kinds: &'a [&'a str],
    /// The path from the outputs to the array, e.g. `["reconcile", "tenants"]`.
    pub path: &'a [&'a str],
    /// The field of each element that names it, e.g. `tenant`.
    pub field: &'a str,
}

/// The element named `key` from the latest succeeded job that has one.
#[derive(Clone, Debug, PartialEq)]
pub struct LatestEntry {
    pub key: String,
    pub job: i64,
    pub finished_at: OffsetDateTime,
    pub entry: Value,
}

/// Unfinished jobs of one tenant, kind and state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenCount {
    pub tenant: String,
    pub kind: String,
    pub state: JobState,
    pub jobs: i64,
}

/// The latest succeeded job of any of `kinds`, by the time it finished.
pub async fn latest_succeeded(pool: &PgPool, kinds: &[&str]) -> Result<Option<Job>, EngineError> {
    let cols = job_columns("");
    Ok(sqlx::query_as(&format!(
        "select {cols} from jobs
         where kind = any($1) and queue_state = 'succeeded' and finished_at is not null
         order by finished_at desc limit 1"
    ))
    .bind(kinds)
    .fetch_optional(pool)
    .await?)
}

/// How many of the newest succeeded jobs of each kind [`latest_entries`] looks at: the answer is
/// a bounded read whatever the history holds (a key none of them names is left out).
pub const LATEST_SCAN: i64 = 200;

/// For each key, the element of `at` named by it in the latest succeeded job whose array has one,
/// among the newest [`LATEST_SCAN`] succeeded jobs of each kind. Keys none of them names are left
/// out.
pub async fn latest_entries(
    pool: &PgPool,
    at: &OutputArray<'_>,
    keys: &[&str],
) -> Result<Vec<LatestEntry>, EngineError> {
    // A bounded query, not a scan of the history: the newest jobs of each kind (the jobs_succeeded
    // index, read backwards, LATEST_SCAN rows per kind), read once; then per key the newest of
    // those naming it.
    let rows: Vec<(String, i64, OffsetDateTime, Value)> = sqlx::query_as(
        "with recent as materialized (
           select j.id, j.finished_at, j.outputs #> $3::text[] as arr
           from unnest($2::text[]) k(kind)
           cross join lateral (
             select id, finished_at, outputs from jobs
             where kind = k.kind and queue_state = 'succeeded' and finished_at is not null
             order by finished_at desc
             limit $5) j)
         select distinct on (t.key) t.key, r.id, r.finished_at, e.x
         from unnest($1::text[]) t(key)
         join recent r on r.arr @> jsonb_build_array(jsonb_build_object($4::text, t.key))
         cross join lateral (
           select x from jsonb_array_elements(r.arr) x where x ->> $4::text = t.key limit 1) e
         order by t.key, r.finished_at desc, r.id desc",
    )
    .bind(keys)
    .bind(at.kinds)
    .bind(at.path)
    .bind(at.field)
    .bind(LATEST_SCAN)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(key, job, finished_at, entry)| LatestEntry { key, job, finished_at, entry }).collect())
}

/// Unfinished jobs of the given tenants, counted by tenant, kind and state: read from the partial
/// index of unfinished jobs (jobs_open), never the tenant's history.
pub async fn open_counts(pool: &PgPool, tenants: &[&str]) -> Result<Vec<OpenCount>, EngineError> {
    let rows: Vec<(String, String, JobState, i64)> = sqlx::query_as(
        "select tenant, kind, state, count(*) from jobs
         where tenant = any($1) and queue_state not in ('succeeded', 'cancelled')
         group by tenant, kind, state",
    )
    .bind(tenants)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(tenant, kind, state, jobs)| OpenCount { tenant, kind, state, jobs }).collect())
}

/// Unfinished jobs by state; states with none are left out.
pub async fn open_by_state(pool: &PgPool) -> Result<Vec<(JobState, i64)>, EngineError> {
    Ok(sqlx::query_as(
        "select state, count(*) from jobs where queue_state not in ('succeeded', 'cancelled') group by state",
    )
    .fetch_all(pool)
    .await?)
}

/// Which of these dedupe keys are held by a job that has started (unfinished and no longer
/// pending): key -> job id. Inside the caller's transaction.
pub async fn started_holders(conn: &mut PgConnection, keys: &[&str]) -> Result<HashMap<String, i64>, EngineError> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let rows: Vec<(String, i64)> = sqlx::query_as(
        "select dedupe_key, id from jobs
         where dedupe_key = any($1) and queue_state not in ('succeeded', 'cancelled') and state <> 'pending'",
    )
    .bind(keys)
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().collect())
}

/// The database's clock (where every timestamp of the engine comes from).
pub async fn now(pool: &PgPool) -> Result<OffsetDateTime, EngineError> {
    Ok(sqlx::query_scalar("select now()").fetch_one(pool).await?)
}

/// Whether the database answers: on an idle connection of the pool if there is one, else on a
/// connection of its own. Not through `acquire`: the pool retries a refused connection (a server
/// stopped or restarting) until its acquire timeout, so a database that is down would look slow
/// rather than down; a connection of its own is refused at once.
pub async fn ping(pool: &PgPool) -> Result<(), EngineError> {
    if let Some(mut idle) = pool.try_acquire() {
        // one the server closed fails here (and is not returned to the pool)
        sqlx::query("select 1").execute(&mut *idle).await?;
        return Ok(());
    }
    let mut own = PgConnection::connect_with(&pool.connect_options()).await?;
    sqlx::query("select 1").execute(&mut own).await?;
    let _ = own.close().await;
    Ok(())
}

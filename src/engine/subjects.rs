//! Questions about the jobs of subjects: the latest job of each subject of a tenant, the latest
//! output a step recorded for each subject, and where some jobs stand now. Kinds and step names
//! come from the caller: the engine knows no flow by name.

use serde_json::Value;
use sqlx::PgPool;
use time::OffsetDateTime;

use super::ops::job_columns;
use super::{EngineError, Job, JobState};

/// The output one step of a subject's job recorded, and when.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutput {
    pub subject: String,
    pub job: i64,
    /// When the step finished (when the output was read).
    pub at: OffsetDateTime,
    pub output: Value,
}

/// Where a job stands now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobStanding {
    pub id: i64,
    pub kind: String,
    pub state: JobState,
    pub finished_at: Option<OffsetDateTime>,
}

/// Per subject of `tenant` (or only `subject`), its latest job of `kinds` (by id) whose state
/// is not one of `skip`; sorted by subject.
pub async fn latest_per_subject(
    pool: &PgPool,
    tenant: &str,
    kinds: &[&str],
    subject: Option<&str>,
    skip: &[JobState],
) -> Result<Vec<Job>, EngineError> {
    let cols = job_columns("");
    Ok(sqlx::query_as(&format!(
        "select distinct on (subject) {cols} from jobs
         where tenant = $1 and kind = any($2) and ($3::text is null or subject = $3) and not (state = any($4))
         order by subject, id desc"
    ))
    .bind(tenant)
    .bind(kinds)
    .bind(subject)
    .bind(skip)
    .fetch_all(pool)
    .await?)
}

/// Per subject of `tenant` (or only `subject`), the latest output step `step` of a job of `kinds`
/// recorded when it was done; sorted by subject.
pub async fn latest_step_outputs(
    pool: &PgPool,
    tenant: &str,
    kinds: &[&str],
    step: &str,
    subject: Option<&str>,
) -> Result<Vec<StepOutput>, EngineError> {
    let rows: Vec<(String, i64, OffsetDateTime, Value)> = sqlx::query_as(
        "select distinct on (j.subject) j.subject, j.id, r.finished_at, r.output
         from jobs j
         join step_runs r on r.job_id = j.id and r.step = $3 and r.outcome = 'done'
                         and r.finished_at is not null and r.output is not null
         where j.tenant = $1 and j.kind = any($2) and ($4::text is null or j.subject = $4)
         order by j.subject, r.finished_at desc, r.id desc",
    )
    .bind(tenant)
    .bind(kinds)
    .bind(step)
    .bind(subject)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().map(|(subject, job, at, output)| StepOutput { subject, job, at, output }).collect())
}

/// Where each of these jobs stands now (ids not found are left out).
pub async fn standings(pool: &PgPool, ids: &[i64]) -> Result<Vec<JobStanding>, EngineError> {
    if ids.is_empty() {
        return Ok(vec![]);
    }
    let rows: Vec<(i64, String, JobState, Option<OffsetDateTime>)> =
        sqlx::query_as("select id, kind, state, finished_at from jobs where id = any($1)")
            .bind(ids)
            .fetch_all(pool)
            .await?;
    Ok(rows.into_iter().map(|(id, kind, state, finished_at)| JobStanding { id, kind, state, finished_at }).collect())
}

//! Marks: an effect one step of one job made that must not be repeated (an e-mail sent), recorded
//! at once in a commit of its own rather than with the step's result, which may be lost with its
//! worker. A step that finds its mark on a later attempt knows the effect happened.

use sqlx::PgPool;

use super::EngineError;

/// Records `mark` for `job`; idempotent.
pub async fn mark(pool: &PgPool, job: i64, mark: &str) -> Result<(), EngineError> {
    sqlx::query("insert into step_marks (job_id, mark) values ($1, $2) on conflict do nothing")
        .bind(job)
        .bind(mark)
        .execute(pool)
        .await?;
    Ok(())
}

/// Whether `mark` was recorded for `job`.
pub async fn marked(pool: &PgPool, job: i64, mark: &str) -> Result<bool, EngineError> {
    Ok(sqlx::query_scalar("select exists (select 1 from step_marks where job_id = $1 and mark = $2)")
        .bind(job)
        .bind(mark)
        .fetch_one(pool)
        .await?)
}

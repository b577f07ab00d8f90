//! Marks: an effect one step of one job made that must not be repeated (an e-mail sent), recorded
//! at once in a commit of its own rather than with the step's result, which may be lost with its
//! worker. A step that finds its mark on a later attempt knows the effect happened.
//!
//! The time between the effect and its mark is the time a kill can still repeat the effect, so a
//! mark is written on connections of its own (never queued behind the steps' and workers' use of
//! the main pool) in a commit that does not wait for the disk: once it returns, a kill of this
//! process cannot lose the mark; a crash of PostgreSQL within its WAL writer's delay could, and
//! would lose the step's result with it (the effect is then repeated, as without marks).

use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};

use super::EngineError;

/// The marks' own connections, to the same database as `main`.
pub fn pool(main: &PgPool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .after_connect(|conn, _| {
            Box::pin(async move { conn.execute("set synchronous_commit = off").await.map(|_| ()) })
        })
        .connect_lazy_with((*main.connect_options()).clone())
}

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

//! The planner's statistics of `jobs`, kept fresh by the workers. Right after a burst of enqueues
//! (a thousand onboardings, a webhook storm) PostgreSQL still plans with what it last saw of the
//! table, which may be an empty table: autovacuum analyzes a minute or more later, and not at
//! all where it is turned off. The result writes then took every due job and matched each one to
//! every write of the batch (38 ms for 255 writes over 20,000 due jobs). A worker whose claim
//! finds more due work than it has slots asks for an ANALYZE when the table grew or changed a
//! lot since the last one; it takes a sample, so it costs tens of milliseconds whatever the
//! table's size.

use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::EngineError;

/// At most one look per worker this often.
const EVERY: Duration = Duration::from_secs(5);

/// After a claim that found a backlog: looks (at most every [`EVERY`] since `last`) whether
/// `jobs` needs analyzing, in a task of its own, so the claim loop does not wait for it.
pub(crate) fn after_backlog(pool: &PgPool, last: &mut Option<Instant>) {
    let now = Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < EVERY) {
        return;
    }
    *last = Some(now);
    let pool = pool.clone();
    tokio::spawn(async move {
        match refresh(&pool).await {
            Ok(true) => tracing::debug!("analyzed jobs after a burst"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not analyze jobs"),
        }
    });
}

/// Analyzes `jobs` if it grew to more than twice its size at its last analysis (read from the
/// file's size, which counts every committed insert at once) or if more of it changed since than
/// autovacuum's default threshold (50 rows and a tenth of the table) plus a thousand (counters
/// that backends report a second or more late). Returns whether it did.
async fn refresh(pool: &PgPool) -> Result<bool, EngineError> {
    let stale: bool = sqlx::query_scalar(
        "select coalesce((select pg_relation_size(c.oid) / current_setting('block_size')::int > 2 * c.relpages + 40
                                 or s.n_mod_since_analyze > 1050 + 0.1 * greatest(c.reltuples, 0)
                          from pg_class c join pg_stat_user_tables s on s.relid = c.oid
                          where c.oid = 'jobs'::regclass), false)",
    )
    .fetch_one(pool)
    .await?;
    if stale {
        sqlx::query("analyze jobs").execute(pool).await?;
    }
    Ok(stale)
}

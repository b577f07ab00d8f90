//! The planner's statistics of `jobs`, kept fresh by the workers. Right after a burst of enqueues
//! (a thousand onboardings, a webhook storm) PostgreSQL still plans with what it last saw of the
//! table, which may be an empty table: autovacuum analyzes a minute or more later, and not at
//! all where it is turned off. The result writes then took every due job and matched each one to
//! every write of the batch (38 ms for 255 writes over 20,000 due jobs). A worker whose claim
//! finds more due work than it has slots asks for an ANALYZE when the table changed a lot since
//! the last one; it takes a sample, so it costs tens of milliseconds whatever the table's size.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use super::EngineError;

/// At most one look per process this often.
const EVERY: Duration = Duration::from_secs(5);

/// When this process last looked (None: never).
#[derive(Debug, Default)]
pub(crate) struct Freshness {
    last: Mutex<Option<Instant>>,
}

impl Freshness {
    /// Whether it is time to look again; marks the look.
    pub(crate) fn due(&self) -> bool {
        let mut last = self.last.lock().expect("freshness lock");
        let now = Instant::now();
        if last.is_some_and(|t| now.duration_since(t) < EVERY) {
            return false;
        }
        *last = Some(now);
        true
    }
}

/// Analyzes `jobs` if more of it changed since its last analysis than autovacuum's default
/// threshold (50 rows and a tenth of the table) plus a thousand. Returns whether it did.
pub(crate) async fn refresh(pool: &PgPool) -> Result<bool, EngineError> {
    let stale: bool = sqlx::query_scalar(
        "select coalesce((select s.n_mod_since_analyze > 1050 + 0.1 * greatest(c.reltuples, 0)
                          from pg_stat_user_tables s join pg_class c on c.oid = s.relid
                          where s.relid = 'jobs'::regclass), false)",
    )
    .fetch_one(pool)
    .await?;
    if stale {
        sqlx::query("analyze jobs").execute(pool).await?;
    }
    Ok(stale)
}

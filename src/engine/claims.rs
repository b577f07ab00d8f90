//! Claims: a value in a scope belongs to one owner for good (first come, first served), shared by
//! every replica through one table. A flow uses them for what must stay unique across jobs.

use sqlx::PgPool;

use super::EngineError;

/// Whose a claimed value is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Claim {
    /// It is (now, or was already) this owner's.
    Granted,
    /// It belongs to someone else.
    Taken { owner: String },
}

/// Claims `value` in `scope` for `owner`; idempotent for the same owner.
pub async fn claim(pool: &PgPool, scope: &str, value: &str, owner: &str, job: i64) -> Result<Claim, EngineError> {
    // A concurrent first claim commits while this statement waits on it; this statement's
    // snapshot then misses the row, so it is read again by the next statement.
    for _ in 0..3 {
        let existing: Option<String> = sqlx::query_scalar(
            "with ins as (
                 insert into claims (scope, value, owner, claimed_by_job) values ($1, $2, $3, $4)
                 on conflict (scope, value) do nothing returning owner)
             select owner from ins union all select owner from claims where scope = $1 and value = $2 limit 1",
        )
        .bind(scope)
        .bind(value)
        .bind(owner)
        .bind(job)
        .fetch_optional(pool)
        .await?;
        if let Some(existing) = existing {
            return Ok(if existing == owner { Claim::Granted } else { Claim::Taken { owner: existing } });
        }
    }
    Err(EngineError::Corrupt(format!("claim {scope}/{value}: neither inserted nor found")))
}

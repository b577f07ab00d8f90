//! `Idempotency-Key` for starting work: per token, a key answers the job its first request
//! started, as long as the request is the same; the same key with another request is refused.
//! Concurrent requests with one key are serialized by a transaction-scoped advisory lock on it,
//! and the key is stored in the transaction that creates the job.

use axum::http::{HeaderMap, StatusCode};
use sha2::{Digest, Sha256};

use super::Problem;
use crate::engine::{Engine, EngineError, Enqueued, NewJob};

pub const HEADER: &str = "idempotency-key";
const MAX_LEN: usize = 200;

/// The key sent with a request, if any.
pub fn key(headers: &HeaderMap) -> Result<Option<String>, Problem> {
    let Some(v) = headers.get(HEADER) else {
        return Ok(None);
    };
    let k = v.to_str().ok().map(str::trim).filter(|k| !k.is_empty() && k.len() <= MAX_LEN);
    match k {
        Some(k) => Ok(Some(k.to_string())),
        None => Err(Problem::unprocessable(format!(
            "the Idempotency-Key header must be 1 to {MAX_LEN} visible ASCII characters"
        ))),
    }
}

/// What became of a request.
pub struct Started {
    pub job: Enqueued,
    /// The key had answered this request before: the job is the one it started then.
    pub replayed: bool,
}

/// How long a key answers for its first request (then it may be used again, for anything).
pub const KEEP: &str = "24 hours";

/// Enqueues `job` (a request whose normalized form is `request`), honouring `key` for `token`.
pub async fn start(
    engine: &Engine,
    token: &str,
    key: Option<&str>,
    request: &[u8],
    job: NewJob,
) -> Result<Started, Problem> {
    let Some(key) = key else {
        let e = engine.enqueue(&[job]).await?;
        return Ok(Started { job: e[0], replayed: false });
    };
    let hash = Sha256::digest(request).to_vec();
    let db = |e: sqlx::Error| Problem::from(EngineError::from(e));
    let mut tx = engine.pool().begin().await.map_err(db)?;
    sqlx::query("select pg_advisory_xact_lock(hashtextextended($1 || E'\\n' || $2, 11))")
        .bind(token)
        .bind(key)
        .execute(&mut *tx)
        .await
        .map_err(db)?;
    let seen: Option<(Vec<u8>, i64)> = sqlx::query_as(
        "select request_hash, job_id from idempotency_keys
             where token_name = $1 and key = $2 and created_at > now() - $3::interval",
    )
    .bind(token)
    .bind(key)
    .bind(KEEP)
    .fetch_optional(&mut *tx)
    .await
    .map_err(db)?;
    if let Some((seen_hash, id)) = seen {
        return if seen_hash == hash {
            Ok(Started { job: Enqueued { id, created: false }, replayed: true })
        } else {
            Err(Problem::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency-key-reused",
                "Idempotency key reused",
                format!("Idempotency-Key {key:?} was used for another request (job {id}); use a new key"),
            ))
        };
    }
    let e = engine.enqueue_in(&mut tx, &[job]).await?[0];
    // a few expired keys go each time; an expired key of this request is taken over
    sqlx::query(
        "delete from idempotency_keys where ctid = any(array(
           select ctid from idempotency_keys where created_at < now() - $1::interval limit 100))",
    )
    .bind(KEEP)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    sqlx::query(
        "insert into idempotency_keys (token_name, key, request_hash, job_id) values ($1, $2, $3, $4)
         on conflict (token_name, key) do update
           set request_hash = excluded.request_hash, job_id = excluded.job_id, created_at = now()",
    )
    .bind(token)
    .bind(key)
    .bind(&hash)
    .bind(e.id)
    .execute(&mut *tx)
    .await
    .map_err(db)?;
    tx.commit().await.map_err(db)?;
    Ok(Started { job: e, replayed: false })
}

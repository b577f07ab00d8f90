//! The subscriptions' rows: created, listed, deleted, and held by a worker's lease while it
//! delivers. Every write of a delivering worker is fenced by its lease.

use std::time::Duration;

use sqlx::PgPool;
use time::OffsetDateTime;

use super::super::EngineError;
use super::Secret;
use super::log::Hold;
use super::{NewSubscription, Subscription};

const COLUMNS: &str = "id, url, tenant, events, created_by, created_at, cursor, attempts, next_attempt_at, delivered,
     given_up, last_status, last_error, last_attempt_at";

type Row = (
    i64,
    String,
    Option<String>,
    Vec<String>,
    String,
    OffsetDateTime,
    i64,
    i32,
    OffsetDateTime,
    i64,
    i64,
    Option<i32>,
    Option<String>,
    Option<OffsetDateTime>,
);

fn from_row(r: Row) -> Subscription {
    let (id, url, tenant, events, created_by, created_at, cursor, attempts, next_attempt_at, delivered, given_up) =
        (r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7, r.8, r.9, r.10);
    Subscription {
        id,
        url,
        tenant,
        events,
        created_by,
        created_at,
        cursor,
        attempts,
        next_attempt_at,
        delivered,
        given_up,
        last_status: r.11,
        last_error: r.12,
        last_attempt_at: r.13,
    }
}

pub async fn create(pool: &PgPool, new: &NewSubscription, secret: &Secret) -> Result<Subscription, EngineError> {
    let events: Vec<String> = new.events.iter().map(|e| e.name()).collect();
    let row: Row = sqlx::query_as(&format!(
        "insert into callback_subscriptions (url, tenant, events, secret, created_by, cursor)
         values ($1, $2, $3, $4, $5, (select coalesce(max(id), 0) from job_events))
         returning {COLUMNS}"
    ))
    .bind(&new.url)
    .bind(&new.tenant)
    .bind(&events)
    .bind(secret.expose())
    .bind(&new.created_by)
    .fetch_one(pool)
    .await?;
    Ok(from_row(row))
}

pub async fn list(pool: &PgPool) -> Result<Vec<Subscription>, EngineError> {
    let rows: Vec<Row> =
        sqlx::query_as(&format!("select {COLUMNS} from callback_subscriptions order by id")).fetch_all(pool).await?;
    Ok(rows.into_iter().map(from_row).collect())
}

pub async fn delete(pool: &PgPool, id: i64) -> Result<bool, EngineError> {
    let n = sqlx::query("delete from callback_subscriptions where id = $1").bind(id).execute(pool).await?;
    Ok(n.rows_affected() > 0)
}

/// A subscription held by this worker.
pub struct Held {
    pub id: i64,
    pub url: String,
    pub tenant: Option<String>,
    pub events: Vec<String>,
    pub secret: Secret,
    pub cursor: i64,
    pub hold: Option<Hold>,
    pub attempts: i32,
}

/// Takes up to `limit` due subscriptions that no live lease holds.
pub async fn claim(pool: &PgPool, owner: &str, lease: Duration, limit: i64) -> Result<Vec<Held>, EngineError> {
    type Claimed = (i64, String, Option<String>, Vec<String>, String, i64, Option<OffsetDateTime>, Option<i64>, i32);
    let rows: Vec<Claimed> = sqlx::query_as(
        "update callback_subscriptions s
         set lease_owner = $1, lease_until = now() + $2 * interval '1 millisecond'
         where s.id in (
           select id from callback_subscriptions
           where next_attempt_at <= now() and (lease_until is null or lease_until < now())
           order by next_attempt_at limit $3
           for update skip locked)
         returning id, url, tenant, events, secret, cursor, held_since, held_upto, attempts",
    )
    .bind(owner)
    .bind(lease.as_millis() as i64)
    .bind(limit)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, url, tenant, events, secret, cursor, since, upto, attempts)| Held {
            id,
            url,
            tenant,
            events,
            secret: Secret::new(secret),
            cursor,
            hold: since.zip(upto).map(|(since, upto)| Hold { since, upto }),
            attempts,
        })
        .collect())
}

/// Moves the cursor forward to `to` (the lease is renewed); `delivered` counts a success, and
/// `given_up` an event abandoned after its last attempt. False when the lease was lost.
#[allow(clippy::too_many_arguments)]
pub async fn advance(
    pool: &PgPool,
    owner: &str,
    id: i64,
    to: i64,
    hold: Option<Hold>,
    lease: Duration,
    outcome: Advance,
) -> Result<bool, EngineError> {
    let n = sqlx::query(
        "update callback_subscriptions
         set cursor = greatest(cursor, $3), held_since = $4, held_upto = $5,
             attempts = case when $3 > cursor then 0 else attempts end,
             lease_until = now() + $6 * interval '1 millisecond',
             delivered = delivered + $7, given_up = given_up + $8,
             last_status = coalesce($9, last_status), last_attempt_at = case when $7 + $8 > 0 then now() else last_attempt_at end,
             last_error = case when $7 > 0 then null else last_error end
         where id = $1 and lease_owner = $2",
    )
    .bind(id)
    .bind(owner)
    .bind(to)
    .bind(hold.map(|h| h.since))
    .bind(hold.map(|h| h.upto))
    .bind(lease.as_millis() as i64)
    .bind(i64::from(outcome == Advance::Delivered))
    .bind(i64::from(outcome == Advance::GivenUp))
    .bind(match outcome {
        Advance::Delivered => Some(200),
        _ => None,
    })
    .execute(pool)
    .await?;
    Ok(n.rows_affected() > 0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advance {
    /// Past events that were not asked for.
    Skipped,
    Delivered,
    GivenUp,
}

/// A failed attempt: the events up to `cursor` are done, the next one failed `attempts` times.
pub struct Failure<'a> {
    pub cursor: i64,
    pub attempts: u32,
    pub status: Option<u16>,
    pub error: &'a str,
    pub retry_in: Duration,
}

/// Records a failed attempt and when to try again; the lease is let go.
pub async fn failed(pool: &PgPool, owner: &str, id: i64, f: Failure<'_>) -> Result<(), EngineError> {
    sqlx::query(
        "update callback_subscriptions
         set cursor = greatest(cursor, $3), held_since = null, held_upto = null, attempts = $4,
             last_status = $5, last_error = $6, last_attempt_at = now(),
             next_attempt_at = now() + $7 * interval '1 millisecond', lease_owner = null, lease_until = null
         where id = $1 and lease_owner = $2",
    )
    .bind(id)
    .bind(owner)
    .bind(f.cursor)
    .bind(i32::try_from(f.attempts).unwrap_or(i32::MAX))
    .bind(f.status.map(i32::from))
    .bind(f.error)
    .bind(f.retry_in.as_millis() as i64)
    .execute(pool)
    .await?;
    Ok(())
}

/// Lets the lease go; the subscription is due again after `after`.
pub async fn release(pool: &PgPool, owner: &str, id: i64, after: Duration) -> Result<(), EngineError> {
    sqlx::query(
        "update callback_subscriptions
         set lease_owner = null, lease_until = null, next_attempt_at = now() + $3 * interval '1 millisecond'
         where id = $1 and lease_owner = $2",
    )
    .bind(id)
    .bind(owner)
    .bind(after.as_millis() as i64)
    .execute(pool)
    .await?;
    Ok(())
}

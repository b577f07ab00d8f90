//! Retention of stored webhook deliveries: deleted once received longer ago than a setting, a
//! batch at a time, found through the primary key (ids are UUIDv7, so id order is arrival order
//! and the oldest are at its left edge; no index on `received_at` is kept on the hot path). The
//! same round sets the list of pending deliveries right after a rolling upgrade past 0029.

use std::time::Duration;

use sqlx::PgPool;

/// Deletes up to `batch` processed deliveries received more than `older_than` ago; returns how
/// many (a pending one is kept until the pump has processed it). A
/// duplicate is recognised only while its first delivery is kept, so `older_than` must outlive
/// Authentik's resends (hours), which the setting's floor ensures.
pub async fn prune_deliveries(pool: &PgPool, older_than: Duration, batch: u32) -> Result<u64, sqlx::Error> {
    let r = sqlx::query(
        "with cutoff as materialized (select now() - $1 * interval '1 second' as at),
         bound as materialized (
           -- the smallest UUIDv7 of the cutoff's millisecond: every id below it is older
           select (lpad(to_hex((extract(epoch from at) * 1000)::bigint), 12, '0') || '00000000000000000000')::uuid as id
           from cutoff)
         delete from webhook_deliveries where id = any(array(
           select id from webhook_deliveries
           where id < (select id from bound) and received_at < (select at from cutoff)
             -- never one the pump has not processed yet: it would be lost
             and processed_at is not null
           order by id
           limit $2
           for update skip locked))",
    )
    .bind(older_than.as_secs_f64())
    .bind(i64::from(batch))
    .execute(pool)
    .await?;
    Ok(r.rows_affected())
}

/// Sets the list of pending deliveries right: lists every unprocessed delivery that is not
/// listed and takes off the list every id whose delivery is processed or gone; returns how many
/// of each. The statement that stores a delivery lists it and the round that processes it takes
/// it off, in one transaction each, so neither is found here: they come from replicas of a release
/// before migration 0029 still running while the Deployments roll (they store deliveries
/// unlisted and mark them processed without taking them off), or from an operator's hand. One
/// scan of the deliveries; the ids a pump holds are skipped.
pub async fn repair_pending_list(pool: &PgPool) -> Result<(u64, u64), sqlx::Error> {
    let (listed, unlisted): (i64, i64) = sqlx::query_as(
        "with listed as (
           insert into webhook_deliveries_pending (id)
           select d.id from webhook_deliveries d
           where d.processed_at is null
             and not exists (select 1 from webhook_deliveries_pending p where p.id = d.id)
           on conflict do nothing
           returning id),
         unlisted as (
           delete from webhook_deliveries_pending where id = any(array(
             select p.id from webhook_deliveries_pending p
             where not exists (select 1 from webhook_deliveries d where d.id = p.id and d.processed_at is null)
             for update skip locked))
           returning id)
         select (select count(*) from listed), (select count(*) from unlisted)",
    )
    .fetch_one(pool)
    .await?;
    Ok((listed as u64, unlisted as u64))
}

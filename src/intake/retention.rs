//! Retention of stored webhook deliveries: deleted once received longer ago than a setting, a
//! batch at a time, found through the primary key (ids are UUIDv7, so id order is arrival order
//! and the oldest are at its left edge; no index on `received_at` is kept on the hot path).

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

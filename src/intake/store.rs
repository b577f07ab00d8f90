//! The SQL of the intake's writer: one statement stores some deliveries (a multi-row insert) and
//! lists them as pending (`webhook_deliveries_pending`, a narrow row each). Their reconcile jobs
//! are the pump's (`pump`).

use std::collections::HashMap;

use uuid::Uuid;

use super::writer::{Delivery, Stored};
use sqlx::PgConnection;

use crate::engine::EngineError;

/// key, id if inserted now, id if stored before
type DeliveryRow = (String, Option<Uuid>, Option<Uuid>);

/// One statement (its own transaction: no BEGIN and COMMIT round trips) for these deliveries.
/// Returns one result per delivery, in order.
pub(super) async fn write(conn: &mut PgConnection, ds: &[Delivery]) -> Result<Vec<Stored>, EngineError> {
    // Duplicates inside the batch: the first one with a key stands for the others.
    let mut first: HashMap<&str, usize> = HashMap::new();
    let unique: Vec<usize> = (0..ds.len()).filter(|&i| *first.entry(ds[i].key.as_str()).or_insert(i) == i).collect();
    let pick = |f: fn(&Delivery) -> Option<&str>| unique.iter().map(|&i| f(&ds[i])).collect::<Vec<_>>();

    // the stored id of a key not inserted now is looked up only for those (duplicates are rare)
    let rows: Vec<DeliveryRow> = sqlx::query_as(
        "with v as (
           select * from unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[],
                                $8::jsonb[], $9::bytea[], $10::text[])
             as v(id, key, remote_addr, shape, action, model, body, targets, raw_body, traceparent)),
         ins as (
           insert into webhook_deliveries (id, delivery_key, remote_addr, shape, action, model, body, targets, raw_body,
                                           traceparent)
           select id, key, remote_addr, shape, action, model, body, targets, raw_body, traceparent from v
           on conflict (delivery_key) do nothing
           returning id, delivery_key),
         -- pending until the pump has enqueued its jobs (migration 0029)
         pend as (insert into webhook_deliveries_pending (id) select id from ins)
         select v.key, ins.id,
                case when ins.id is null then (select d.id from webhook_deliveries d where d.delivery_key = v.key) end
         from v left join ins on ins.delivery_key = v.key",
    )
    .bind(unique.iter().map(|&i| ds[i].id).collect::<Vec<_>>())
    .bind(pick(|d| Some(d.key.as_str())))
    .bind(pick(|d| d.remote_addr.as_deref()))
    .bind(pick(|d| Some(d.shape)))
    .bind(pick(|d| d.action.as_deref()))
    .bind(pick(|d| d.model.as_deref()))
    .bind(unique.iter().map(|&i| &ds[i].body).collect::<Vec<_>>())
    .bind(unique.iter().map(|&i| &ds[i].targets).collect::<Vec<_>>())
    .bind(unique.iter().map(|&i| ds[i].raw_body.as_deref()).collect::<Vec<_>>())
    .bind(pick(|d| d.traceparent.as_deref()))
    .fetch_all(&mut *conn)
    .await?;
    let by_key: HashMap<String, (Option<Uuid>, Option<Uuid>)> =
        rows.into_iter().map(|(key, inserted, existing)| (key, (inserted, existing))).collect();

    let mut out: Vec<Option<Stored>> = vec![None; ds.len()];
    for &i in &unique {
        let (inserted, existing) = by_key.get(ds[i].key.as_str()).copied().unwrap_or((None, None));
        out[i] = Some(match (inserted, existing) {
            (Some(id), _) => Stored { id, duplicate: false },
            (None, Some(id)) => Stored { id, duplicate: true },
            // inserted by a concurrent transaction that committed after this statement began (so
            // a later statement sees it)
            (None, None) => {
                let id: Uuid = sqlx::query_scalar("select id from webhook_deliveries where delivery_key = $1")
                    .bind(&ds[i].key)
                    .fetch_one(&mut *conn)
                    .await?;
                Stored { id, duplicate: true }
            }
        });
    }
    for i in 0..ds.len() {
        if out[i].is_none() {
            let f = first[ds[i].key.as_str()];
            let s = out[f].clone().expect("the first of a key is stored");
            out[i] = Some(Stored { id: s.id, duplicate: true });
        }
    }
    Ok(out.into_iter().map(|s| s.expect("every delivery has a result")).collect())
}

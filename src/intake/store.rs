//! The SQL of the intake's writer: one transaction stores some deliveries (a multi-row insert)
//! and enqueues their reconcile jobs.

use std::collections::HashMap;

use uuid::Uuid;

use super::writer::{Delivery, Stored};
use crate::engine::{Engine, EngineError, NewJob};

/// key, id if inserted now, id if stored before
type DeliveryRow = (String, Option<Uuid>, Option<Uuid>);

/// One transaction for these deliveries. Returns one result per delivery, in order.
pub(super) async fn write(engine: &Engine, ds: &[Delivery]) -> Result<Vec<Stored>, EngineError> {
    // Duplicates inside the batch: the first one with a key stands for the others.
    let mut first: HashMap<&str, usize> = HashMap::new();
    let unique: Vec<usize> = (0..ds.len()).filter(|&i| *first.entry(ds[i].key.as_str()).or_insert(i) == i).collect();
    let pick = |f: fn(&Delivery) -> Option<&str>| unique.iter().map(|&i| f(&ds[i])).collect::<Vec<_>>();

    // Reconcile jobs collapse into a pending job with the same key; one that already started may
    // have read Authentik before this change, so a new job is queued behind it instead.
    let mut keys: Vec<&str> =
        unique.iter().flat_map(|&i| ds[i].jobs.iter().filter_map(|j| j.dedupe_key.as_deref())).collect();
    keys.sort_unstable();
    keys.dedup();

    let mut tx = engine.pool().begin().await?;
    let rows: Vec<DeliveryRow> = sqlx::query_as(
        "with v as (
           select * from unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[],
                                $8::jsonb[], $9::bytea[])
             as v(id, key, remote_addr, shape, action, model, body, targets, raw_body)),
         ins as (
           insert into webhook_deliveries (id, delivery_key, remote_addr, shape, action, model, body, targets, raw_body)
           select id, key, remote_addr, shape, action, model, body, targets, raw_body from v
           on conflict (delivery_key) do nothing
           returning id, delivery_key)
         select v.key, ins.id, d.id
         from v left join ins on ins.delivery_key = v.key
                left join webhook_deliveries d on d.delivery_key = v.key",
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
    .fetch_all(&mut *tx)
    .await?;
    let by_key: HashMap<String, (Option<Uuid>, Option<Uuid>)> =
        rows.into_iter().map(|(key, inserted, existing)| (key, (inserted, existing))).collect();
    let holders = engine.started_holders_in(&mut tx, &keys).await?;

    let mut out: Vec<Option<Stored>> = vec![None; ds.len()];
    let mut jobs: Vec<NewJob> = Vec::new();
    let mut owners: Vec<usize> = Vec::new();
    for &i in &unique {
        let (inserted, existing) = by_key.get(ds[i].key.as_str()).copied().unwrap_or((None, None));
        match (inserted, existing) {
            (Some(id), _) => {
                for j in &ds[i].jobs {
                    let mut j = j.clone();
                    if let Some(held) = j.dedupe_key.as_deref().and_then(|k| holders.get(k)) {
                        j.dedupe_key = Some(format!("{}:after:{held}", j.dedupe_key.as_deref().unwrap_or_default()));
                    }
                    jobs.push(j);
                    owners.push(i);
                }
                out[i] = Some(Stored { id, duplicate: false, jobs: vec![] });
            }
            (None, Some(id)) => out[i] = Some(Stored { id, duplicate: true, jobs: vec![] }),
            // inserted by a concurrent transaction that committed after this statement began
            (None, None) => {
                let id: Uuid = sqlx::query_scalar("select id from webhook_deliveries where delivery_key = $1")
                    .bind(&ds[i].key)
                    .fetch_one(&mut *tx)
                    .await?;
                out[i] = Some(Stored { id, duplicate: true, jobs: vec![] });
            }
        }
    }
    let enqueued = engine.enqueue_in(&mut tx, &jobs).await?;
    tx.commit().await?;
    for (e, &i) in enqueued.iter().zip(&owners) {
        if let Some(s) = out[i].as_mut() {
            s.jobs.push(e.id);
        }
    }
    for i in 0..ds.len() {
        if out[i].is_none() {
            let f = first[ds[i].key.as_str()];
            let mut s = out[f].clone().expect("the first of a key is stored");
            s.duplicate = true;
            s.jobs.clear();
            out[i] = Some(s);
        }
    }
    Ok(out.into_iter().map(|s| s.expect("every delivery has a result")).collect())
}

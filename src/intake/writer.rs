//! The batching writer: concurrent deliveries share transactions (and so commits). Handlers hand
//! a verified, parsed delivery over a channel and wait for the reply; a writer task takes
//! everything queued, stores it with one multi-row insert, enqueues the reconcile jobs in the
//! same transaction, commits once and answers each handler.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::engine::{Engine, NewJob};

/// A delivery ready to store.
#[derive(Debug)]
pub struct Delivery {
    pub id: Uuid,
    pub key: String,
    pub remote_addr: Option<String>,
    pub shape: &'static str,
    pub action: Option<String>,
    pub model: Option<String>,
    pub body: Value,
    pub targets: Value,
    /// Reconcile jobs to enqueue with it (only if it is not a duplicate).
    pub jobs: Vec<NewJob>,
}

/// What became of a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The delivery's id; for a duplicate, the id of the delivery stored first.
    pub id: Uuid,
    pub duplicate: bool,
    pub jobs: Vec<i64>,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum WriteError {
    #[error("the delivery could not be stored: {0}")]
    Db(String),
    #[error("the writer is shutting down")]
    Closed,
}

type Request = (Delivery, oneshot::Sender<Result<Stored, WriteError>>);

/// key, id if inserted now, id if stored before
type DeliveryRow = (String, Option<Uuid>, Option<Uuid>);

/// The handlers' side: cheap to clone.
#[derive(Clone)]
pub struct DeliveryWriter {
    tx: mpsc::Sender<Request>,
}

impl DeliveryWriter {
    /// Starts `writers` tasks sharing one queue; each writes up to `max_batch` deliveries per
    /// transaction. The tasks end when every `DeliveryWriter` clone is dropped.
    pub fn start(engine: Engine, writers: usize, max_batch: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Request>(max_batch * writers.max(1) * 4);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..writers.max(1) {
            let (rx, engine) = (rx.clone(), engine.clone());
            tokio::spawn(async move {
                let mut batch = Vec::with_capacity(max_batch);
                loop {
                    {
                        let mut rx = rx.lock().await;
                        if rx.recv_many(&mut batch, max_batch).await == 0 {
                            return;
                        }
                    }
                    write_batch(&engine, std::mem::take(&mut batch)).await;
                }
            });
        }
        Self { tx }
    }

    pub async fn store(&self, d: Delivery) -> Result<Stored, WriteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((d, reply)).await.map_err(|_| WriteError::Closed)?;
        rx.await.map_err(|_| WriteError::Closed)?
    }
}

async fn write_batch(engine: &Engine, batch: Vec<Request>) {
    let (deliveries, replies): (Vec<Delivery>, Vec<_>) = batch.into_iter().unzip();
    let started = std::time::Instant::now();
    let result = write(engine, &deliveries).await;
    tracing::debug!(n = deliveries.len(), ms = started.elapsed().as_secs_f64() * 1e3, "webhook deliveries written");
    if let Err(e) = &result {
        tracing::error!(error = %e, n = deliveries.len(), "storing webhook deliveries failed");
    }
    for (i, reply) in replies.into_iter().enumerate() {
        let r = match &result {
            Ok(stored) => Ok(stored[i].clone()),
            Err(e) => Err(WriteError::Db(e.to_string())),
        };
        let _ = reply.send(r);
    }
}

/// One transaction for the whole batch. Returns one result per delivery, in order.
async fn write(engine: &Engine, ds: &[Delivery]) -> Result<Vec<Stored>, crate::engine::EngineError> {
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
           select * from unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[], $8::jsonb[])
             as v(id, key, remote_addr, shape, action, model, body, targets)),
         ins as (
           insert into webhook_deliveries (id, delivery_key, remote_addr, shape, action, model, body, targets)
           select id, key, remote_addr, shape, action, model, body, targets from v
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

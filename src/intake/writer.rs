//! The batching writer: concurrent deliveries share transactions (and so commits). Handlers hand
//! a verified, parsed delivery over a channel and wait for the reply; a writer task takes
//! everything queued, stores it with one multi-row insert (`store`), commits once, answers each
//! handler and wakes the pump (`pump`), which turns stored deliveries into reconcile jobs.
//!
//! One delivery never fails the others: when PostgreSQL refuses a shared transaction, its
//! deliveries are written again in halves until the failing one is alone, and its answer says
//! whether sending it again can help ([`WriteError::Unavailable`]) or not
//! ([`WriteError::Refused`]).

use std::ops::Range;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::handoff::Handoff;
use super::store;
use crate::engine::kept::Kept;
use crate::engine::{Engine, EngineError};

/// A delivery ready to store.
#[derive(Debug)]
pub struct Delivery {
    pub id: Uuid,
    pub key: String,
    pub remote_addr: Option<String>,
    pub shape: &'static str,
    pub action: Option<String>,
    pub model: Option<String>,
    /// The body as stored (see `event::scrub_nul`).
    pub body: Value,
    /// The bytes as received, when `body` differs from them.
    pub raw_body: Option<Vec<u8>>,
    /// Whom to reconcile: `Subject::to_target`'s strings (the pump reads them back).
    pub targets: Value,
    /// The trace context of the delivery's span, when traces are exported: its jobs join it.
    pub traceparent: Option<String>,
}

/// What became of a delivery.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// The delivery's id; for a duplicate, the id of the delivery stored first.
    pub id: Uuid,
    pub duplicate: bool,
}

#[derive(Clone, Debug, thiserror::Error)]
pub enum WriteError {
    /// The database failed for a while (unreachable, a conflict): the same delivery may be
    /// stored when sent again.
    #[error("the delivery could not be stored: {0}")]
    Unavailable(String),
    /// PostgreSQL refuses this delivery's data: sending it again will not help.
    #[error("PostgreSQL refuses to store this delivery: {0}")]
    Refused(String),
    #[error("the writer is shutting down")]
    Closed,
}

type Reply = oneshot::Sender<Result<Stored, WriteError>>;
type Request = (Delivery, Reply);

/// The handlers' side: cheap to clone.
#[derive(Clone)]
pub struct DeliveryWriter {
    tx: mpsc::Sender<Request>,
}

impl DeliveryWriter {
    /// Starts `writers` tasks sharing one queue; each writes up to `max_batch` deliveries per
    /// transaction and then hands the new ones to `pump`. The tasks end when every `DeliveryWriter` clone is
    /// dropped.
    pub fn start(engine: Engine, writers: usize, max_batch: usize, pump: Arc<Handoff>) -> Self {
        let (tx, rx) = mpsc::channel::<Request>(max_batch * writers.max(1) * 4);
        let rx = Arc::new(tokio::sync::Mutex::new(rx));
        for _ in 0..writers.max(1) {
            let (rx, engine, pump) = (rx.clone(), engine.clone(), pump.clone());
            tokio::spawn(async move {
                let mut batch = Vec::with_capacity(max_batch);
                let mut conn = Kept::new(engine.pool().clone());
                loop {
                    {
                        let mut rx = rx.lock().await;
                        if rx.recv_many(&mut batch, max_batch).await == 0 {
                            return;
                        }
                    }
                    let stored = write_batch(&mut conn, std::mem::take(&mut batch)).await;
                    pump.hand(stored);
                }
            });
        }
        Self { tx }
    }

    /// Deliveries waiting for a writer task.
    pub fn queued(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    pub async fn store(&self, d: Delivery) -> Result<Stored, WriteError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send((d, reply)).await.map_err(|_| WriteError::Closed)?;
        rx.await.map_err(|_| WriteError::Closed)?
    }
}

/// Writes a batch and answers each request; returns the ids of the deliveries stored now.
async fn write_batch(conn: &mut Kept, batch: Vec<Request>) -> Vec<Uuid> {
    let started = std::time::Instant::now();
    let (deliveries, replies): (Vec<Delivery>, Vec<Reply>) = batch.into_iter().unzip();
    let mut replies: Vec<Option<Reply>> = replies.into_iter().map(Some).collect();
    let mut new_ids = Vec::with_capacity(deliveries.len());
    let mut answer = |range: Range<usize>, result: &dyn Fn(usize) -> Result<Stored, WriteError>| {
        for i in range {
            if let Some(reply) = replies[i].take() {
                let _ = reply.send(result(i));
            }
        }
    };
    // ranges still to write, the next one last
    let mut todo: Vec<Range<usize>> = Vec::with_capacity(4);
    todo.push(0..deliveries.len());
    while let Some(range) = todo.pop() {
        let written = match conn.get().await {
            Ok(c) => store::write(c, &deliveries[range.clone()]).await,
            Err(e) => Err(e.into()),
        };
        if written.is_err() {
            conn.discard();
        }
        match written {
            Ok(stored) => {
                new_ids.extend(stored.iter().filter(|s| !s.duplicate).map(|s| s.id));
                answer(range.clone(), &|i| Ok(stored[i - range.start].clone()))
            }
            Err(e) if range.len() > 1 && !connection_failed(&e) => {
                tracing::warn!(error = %e, n = range.len(), "a shared write of webhook deliveries failed: writing them in halves");
                let mid = range.start + range.len() / 2;
                todo.push(mid..range.end);
                todo.push(range.start..mid);
            }
            Err(e) => {
                let err = classify(&e);
                match &err {
                    WriteError::Refused(_) => tracing::warn!(error = %e, "a webhook delivery refused by PostgreSQL"),
                    _ => tracing::error!(error = %e, n = range.len(), "storing webhook deliveries failed"),
                }
                answer(range, &|_| Err(err.clone()));
            }
        }
    }
    tracing::debug!(n = deliveries.len(), ms = started.elapsed().as_secs_f64() * 1e3, "webhook deliveries written");
    new_ids
}

/// The connection or the pool failed: every delivery would, so none is written alone.
pub(super) fn connection_failed(e: &EngineError) -> bool {
    use sqlx::Error as E;
    matches!(
        e,
        EngineError::Db(E::Io(_) | E::Tls(_) | E::Protocol(_) | E::PoolTimedOut | E::PoolClosed | E::WorkerCrashed)
    )
}

/// PostgreSQL's data exceptions (SQLSTATE class 22, e.g. 22P05 `\u0000` in jsonb) and exceeded
/// limits (class 54, e.g. an index row too large) come back for the same data every time:
/// refused. Everything else may pass later.
pub(super) fn classify(e: &EngineError) -> WriteError {
    match e {
        EngineError::Db(sqlx::Error::Database(d)) => match d.code() {
            Some(code) if code.starts_with("22") || code.starts_with("54") => {
                WriteError::Refused(format!("{} (SQLSTATE {code})", d.message()))
            }
            _ => WriteError::Unavailable(e.to_string()),
        },
        EngineError::Db(sqlx::Error::Encode(why)) => WriteError::Refused(why.to_string()),
        _ => WriteError::Unavailable(e.to_string()),
    }
}

//! GET /v1/stream: server-sent events, `job` with the job whenever one the caller sees changes
//! (its state, step, attempt or timer), from the moment of connecting. A token has at most
//! `ONRAMP_HTTP_STREAMS_PER_TOKEN` streams open (then 429 with Retry-After); a stream ends after
//! `ONRAMP_HTTP_STREAM_LIFETIME`, and at shutdown, and clients reconnect. One poller per
//! process reads the changed jobs while any stream is open and hands each batch to every stream,
//! which keeps what its token sees.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use time::OffsetDateTime;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::auth::Auth;
use super::{AppState, Problem};
use crate::engine::{Engine, Job};
use crate::http::access::{Principal, Role};

/// How often a stream looks for changed jobs.
const POLL: Duration = Duration::from_millis(500);
/// What a caller over its streams is told to wait.
const RETRY_AFTER: u64 = 10;

/// The live streams per token.
#[derive(Default)]
pub struct StreamSlots(Mutex<HashMap<String, usize>>);

/// One open stream of a token; the slot is free again when it is dropped.
pub struct StreamSlot {
    slots: Arc<StreamSlots>,
    token: String,
}

impl StreamSlots {
    fn take(self: &Arc<Self>, token: &str, max: usize) -> Option<StreamSlot> {
        let mut open = self.0.lock().expect("stream slots lock");
        let n = open.entry(token.to_string()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        Some(StreamSlot { slots: self.clone(), token: token.to_string() })
    }

    /// Streams open now for `token`.
    pub fn open(&self, token: &str) -> usize {
        self.0.lock().expect("stream slots lock").get(token).copied().unwrap_or(0)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        let mut open = self.slots.0.lock().expect("stream slots lock");
        if let Some(n) = open.get_mut(&self.token) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.token);
            }
        }
    }
}

/// A batch of jobs changed lately.
type Batch = Arc<Vec<Job>>;

/// The one poller of this process's streams, running while any stream listens.
#[derive(Default)]
pub struct JobHub(Mutex<Option<broadcast::Sender<Batch>>>);

impl JobHub {
    /// Listens to the poller, starting it when none runs.
    fn subscribe(self: &Arc<Self>, engine: &Engine, shutdown: &CancellationToken) -> broadcast::Receiver<Batch> {
        let mut slot = self.0.lock().expect("job hub lock");
        if let Some(tx) = slot.as_ref() {
            return tx.subscribe();
        }
        let (tx, rx) = broadcast::channel(16);
        *slot = Some(tx.clone());
        tokio::spawn(poll(self.clone(), engine.clone(), tx, shutdown.clone()));
        rx
    }
}

/// Reads the jobs changed since the last look every half second, with an overlap window, since a
/// transaction's `updated_at` is its start time and it may commit after later ones; stops when
/// no stream listens any more.
async fn poll(hub: Arc<JobHub>, engine: Engine, tx: broadcast::Sender<Batch>, shutdown: CancellationToken) {
    let mut since = engine.now().await.unwrap_or_else(|_| OffsetDateTime::now_utc());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.cancelled() => {}
        }
        {
            let mut slot = hub.0.lock().expect("job hub lock");
            if tx.receiver_count() == 0 || shutdown.is_cancelled() {
                *slot = None;
                return;
            }
        }
        match engine.changed_since(since - OVERLAP, None, 500).await {
            Ok(jobs) if jobs.is_empty() => {}
            Ok(jobs) => {
                since = jobs.iter().map(|j| j.updated_at).fold(since, OffsetDateTime::max);
                let _ = tx.send(Arc::new(jobs));
            }
            Err(e) => tracing::warn!(error = %e, "job stream: query failed"),
        }
    }
}

pub(super) async fn stream(
    auth: Auth,
    State(s): State<AppState>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let p = auth.require(Role::Viewer)?.clone();
    let Some(slot) = s.streams.take(&p.token_name, s.http.streams_per_token) else {
        let mut problem = Problem::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too-many-streams",
            "Too many streams",
            format!(
                "this token has {} live streams open, the most allowed (ONRAMP_HTTP_STREAMS_PER_TOKEN); close one",
                s.http.streams_per_token
            ),
        );
        problem.retry_after = Some(RETRY_AFTER);
        return Err(problem);
    };
    // from the moment of connecting (the overlap window before it included, as every look has)
    let from = s.engine.now().await? - OVERLAP;
    let until = Instant::now() + s.http.stream_lifetime;
    let rx = s.jobs.subscribe(&s.engine, &s.shutdown);
    // a comment now and then keeps proxies (and the server's own idle watch) from closing it
    let keep_alive =
        KeepAlive::new().interval((s.http.idle_timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(15)));
    let feed = Feed { s, p, rx, from, sent: HashMap::new(), queue: Vec::new(), until, _slot: slot };
    Ok(Sse::new(futures_util::stream::unfold(feed, Feed::next)).keep_alive(keep_alive))
}

const OVERLAP: time::Duration = time::Duration::seconds(5);

struct Feed {
    s: AppState,
    p: Principal,
    rx: broadcast::Receiver<Batch>,
    /// Changes before this are not sent.
    from: OffsetDateTime,
    /// What was sent in the overlap window: job id -> updated_at.
    sent: HashMap<i64, OffsetDateTime>,
    queue: Vec<Event>,
    /// When the stream ends.
    until: Instant,
    _slot: StreamSlot,
}

impl Feed {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Self)> {
        loop {
            if let Some(e) = self.queue.pop() {
                return Some((Ok(e), self));
            }
            let jobs = tokio::select! {
                batch = self.rx.recv() => match batch {
                    Ok(jobs) => jobs,
                    // too slow a reader: the batches it missed are gone; the next ones overlap
                    Err(RecvError::Lagged(_)) => continue,
                    Err(RecvError::Closed) => return None,
                },
                _ = tokio::time::sleep_until(self.until) => return None,
                _ = self.s.shutdown.cancelled() => return None,
            };
            let mut newest = None;
            let registry = self.s.tenants.clone();
            let seen = |j: &&Job| j.updated_at > self.from && self.p.sees_job(&j.kind, &j.tenant, registry.as_deref());
            for j in jobs.iter().rev().filter(seen) {
                newest = newest.max(Some(j.updated_at));
                if self.sent.get(&j.id) == Some(&j.updated_at) {
                    continue;
                }
                self.sent.insert(j.id, j.updated_at);
                if let Ok(e) = Event::default().event("job").json_data(j) {
                    self.queue.push(e);
                }
            }
            if let Some(newest) = newest {
                let horizon = newest - OVERLAP - OVERLAP;
                self.sent.retain(|_, at| *at > horizon);
            }
        }
    }
}

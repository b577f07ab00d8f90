//! GET /v1/stream: server-sent events, `job` with the job as it is now whenever one the caller
//! sees changes state, under the id of that change in the audit trail (`job_events`), from the
//! moment of connecting. A client reconnecting with `Last-Event-ID` is first sent what it missed
//! (the newest [`REPLAY`] changes at most). `?tenant=` and `?job=` narrow the stream. A token has
//! at most `ONRAMP_HTTP_STREAMS_PER_TOKEN` streams open (then 429 with Retry-After); a stream ends
//! after `ONRAMP_HTTP_STREAM_LIFETIME`, and at shutdown, and clients reconnect. One poller per
//! process reads the audit trail after its cursor while any stream is open (waiting at a missing
//! id as callbacks do, see `engine::callbacks::log`) and hands each batch to every stream, which
//! keeps what its token and filters see.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;
use time::OffsetDateTime;
use tokio::sync::broadcast::{self, error::RecvError};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::auth::Auth;
use super::extract::Params;
use super::{Problem, Shared};
use crate::domain::names::TenantName;
use crate::engine::callbacks::{Hold, LoggedEvent, settled};
use crate::engine::{Engine, Job};
use crate::http::access::{Principal, Role};

/// How often a stream looks for changed jobs.
const POLL: Duration = Duration::from_millis(500);
/// Most changes replayed to a client that reconnects with `Last-Event-ID` (the newest ones).
pub const REPLAY: i64 = 1000;
/// How long the poller waits at a missing event id (a transaction not yet committed).
const SETTLE: Duration = Duration::from_secs(10);
/// Events read per look.
const BATCH: i64 = 500;
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

/// Changes of jobs: each job once, under the id of its newest change, oldest first.
type Batch = Arc<Vec<(i64, Job)>>;

struct Live {
    tx: broadcast::Sender<Batch>,
    /// Every event up to this id was handed out (or was before the poller started).
    cursor: i64,
}

/// The one poller of this process's streams, running while any stream listens.
#[derive(Default)]
pub struct JobHub(Mutex<Option<Live>>);

impl JobHub {
    /// Listens to the poller, starting it when none runs; with the cursor after which its batches
    /// begin.
    async fn subscribe(
        self: &Arc<Self>,
        engine: &Engine,
        shutdown: &CancellationToken,
    ) -> Result<(broadcast::Receiver<Batch>, i64), Problem> {
        if let Some(live) = self.0.lock().expect("job hub lock").as_ref() {
            return Ok((live.tx.subscribe(), live.cursor));
        }
        let start = engine.last_event_id().await?;
        let mut slot = self.0.lock().expect("job hub lock");
        if let Some(live) = slot.as_ref() {
            return Ok((live.tx.subscribe(), live.cursor));
        }
        let (tx, rx) = broadcast::channel(16);
        *slot = Some(Live { tx, cursor: start });
        tokio::spawn(poll(self.clone(), engine.clone(), shutdown.clone()));
        Ok((rx, start))
    }
}

/// Each job once, under its newest event, oldest first; events of pruned jobs left out.
fn newest_per_job(events: &[LoggedEvent]) -> Vec<(i64, Job)> {
    let mut newest: HashMap<i64, usize> = HashMap::new();
    for (i, e) in events.iter().enumerate() {
        if let Some(j) = &e.job {
            newest.insert(j.id, i);
        }
    }
    let mut out: Vec<(i64, Job)> =
        newest.into_values().filter_map(|i| events[i].job.clone().map(|j| (events[i].id, j))).collect();
    out.sort_by_key(|(id, _)| *id);
    out
}

/// Reads the audit trail after the cursor every half second and hands out what settled; stops
/// when no stream listens any more.
async fn poll(hub: Arc<JobHub>, engine: Engine, shutdown: CancellationToken) {
    let mut hold: Option<Hold> = None;
    loop {
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.cancelled() => {}
        }
        let cursor = {
            let mut slot = hub.0.lock().expect("job hub lock");
            match slot.as_ref() {
                Some(live) if live.tx.receiver_count() > 0 && !shutdown.is_cancelled() => live.cursor,
                _ => {
                    *slot = None;
                    return;
                }
            }
        };
        let events = match engine.next_events(cursor, BATCH).await {
            Ok(events) => events,
            Err(e) => {
                tracing::warn!(error = %e, "job stream: query failed");
                continue;
            }
        };
        let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
        let (n, h) = settled(cursor, &ids, hold, OffsetDateTime::now_utc(), SETTLE);
        hold = h;
        if n == 0 {
            continue;
        }
        let batch = newest_per_job(&events[..n]);
        let mut slot = hub.0.lock().expect("job hub lock");
        if let Some(live) = slot.as_mut() {
            live.cursor = ids[n - 1];
            if !batch.is_empty() {
                let _ = live.tx.send(Arc::new(batch));
            }
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct StreamQuery {
    tenant: Option<String>,
    job: Option<i64>,
}

pub(super) async fn stream(
    auth: Auth,
    State(s): State<Shared>,
    Params(q): Params<StreamQuery>,
    headers: HeaderMap,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let p = auth.require(Role::Viewer)?.clone();
    let tenant =
        q.tenant.as_deref().map(TenantName::parse).transpose().map_err(|e| Problem::bad_request(e.to_string()))?;
    let last = match headers.get("last-event-id").map(|v| v.to_str().unwrap_or("").trim()) {
        None | Some("") => None,
        Some(v) => Some(v.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            Problem::bad_request("Last-Event-ID must be the id of an event this stream sent (a number)")
        })?),
    };
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
    let until = Instant::now() + s.http.stream_lifetime;
    let (rx, cursor) = s.jobs.subscribe(&s.engine, &s.shutdown).await?;
    let filter = Filter { p, tenant: tenant.map(|t| t.as_str().to_string()), job: q.job };
    let mut feed = Feed { s, filter, rx, queue: VecDeque::new(), until, _slot: slot };
    // what a reconnecting client missed, up to where the live batches begin
    if let Some(last) = last.filter(|l| *l < cursor) {
        let missed = feed.s.engine.events_after(last, cursor, REPLAY).await?;
        feed.push(&newest_per_job(&missed));
    }
    // a comment now and then keeps proxies (and the server's own idle watch) from closing it
    let keep_alive = KeepAlive::new()
        .interval((feed.s.http.idle_timeout / 2).clamp(Duration::from_secs(1), Duration::from_secs(15)));
    Ok(Sse::new(futures_util::stream::unfold(feed, Feed::next)).keep_alive(keep_alive))
}

/// What one stream's caller sees, and asked for.
struct Filter {
    p: Principal,
    tenant: Option<String>,
    job: Option<i64>,
}

struct Feed {
    s: Shared,
    filter: Filter,
    rx: broadcast::Receiver<Batch>,
    queue: VecDeque<Event>,
    /// When the stream ends.
    until: Instant,
    _slot: StreamSlot,
}

impl Feed {
    fn push(&mut self, changes: &[(i64, Job)]) {
        let registry = self.s.tenants.clone();
        let f = &self.filter;
        for (id, j) in changes {
            let wanted = f.p.sees_job(&j.kind, &j.tenant, registry.as_deref())
                && f.tenant.as_ref().is_none_or(|t| t == &j.tenant)
                && f.job.is_none_or(|want| want == j.id);
            if wanted && let Ok(e) = Event::default().id(id.to_string()).event("job").json_data(j) {
                self.queue.push_back(e);
            }
        }
    }

    async fn next(mut self) -> Option<(Result<Event, Infallible>, Self)> {
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Some((Ok(e), self));
            }
            let changes = tokio::select! {
                batch = self.rx.recv() => match batch {
                    Ok(changes) => changes,
                    // too slow a reader: the batches it missed are gone; ending the stream lets its
                    // client reconnect with Last-Event-ID and be sent them
                    Err(RecvError::Lagged(_)) => return None,
                    Err(RecvError::Closed) => return None,
                },
                _ = tokio::time::sleep_until(self.until) => return None,
                _ = self.s.shutdown.cancelled() => return None,
            };
            self.push(&changes);
        }
    }
}

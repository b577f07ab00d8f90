//! One HTTP/1.1 connection and its watchdog. A client has `ONRAMP_HTTP_HEADER_TIMEOUT` from
//! connecting, or from the first byte of a later request, to a complete request head; an idle
//! connection (no request, no byte) is closed after `ONRAMP_HTTP_IDLE_TIMEOUT`. A request body
//! that pauses longer than `ONRAMP_HTTP_BODY_TIMEOUT` is answered 408 and the connection closed;
//! the whole request is bounded by the routes' own timeout. While a request is answered, a
//! connection on which no byte moves either way for longer than the idle and request timeouts
//! (a client that stopped reading) is closed too.

use std::convert::Infallible;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::extract::ConnectInfo;
use axum::http::{HeaderValue, Request, Response, StatusCode, header};
use axum::response::IntoResponse;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::Service as _;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;

use crate::http::{HttpSettings, Problem};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Serves one connection until the client or the watchdog ends it, or (after `shutdown`) its
/// request in flight is answered.
pub(super) async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    router: Router,
    s: &HttpSettings,
    shutdown: CancellationToken,
) {
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Tracked { inner: stream, activity: activity.clone() });
    let (act, body_timeout) = (activity.clone(), s.body_timeout);
    let service = hyper::service::service_fn(move |req| handle(req, peer, router.clone(), act.clone(), body_timeout));
    let conn = http1::Builder::new().keep_alive(true).serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let watchdog = watch(&activity, s);
    let mut watchdog = std::pin::pin!(watchdog);
    let mut closing = false;
    loop {
        tokio::select! {
            done = conn.as_mut() => {
                if let Err(e) = done {
                    tracing::debug!(%peer, error = %e, "HTTP connection ended");
                }
                return;
            }
            why = watchdog.as_mut() => {
                tracing::debug!(%peer, why, "HTTP connection closed");
                return;
            }
            _ = shutdown.cancelled(), if !closing => {
                closing = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// One request: the peer's address for the handlers, a timeout on pauses in the body, and the
/// connection marked busy until the response's body is sent.
async fn handle(
    req: Request<Incoming>,
    peer: SocketAddr,
    router: Router,
    activity: Arc<Activity>,
    body_timeout: Duration,
) -> Result<Response<Body>, Infallible> {
    let busy = Busy::enter(activity);
    let stalled = Arc::new(AtomicBool::new(false));
    let mut req = req.map(|b| Body::new(SlowBody::new(b, body_timeout, stalled.clone())));
    req.extensions_mut().insert(ConnectInfo(peer));
    let res = TowerToHyperService::new(router).call(req).await?;
    let res = if stalled.load(SeqCst) { body_stalled(&res) } else { res };
    Ok(res.map(|b| Body::new(Guarded { inner: b, _busy: busy })))
}

/// What a request whose body stalled is answered, whatever the handler made of the error.
fn body_stalled(res: &Response<Body>) -> Response<Body> {
    let mut out = Problem::new(
        StatusCode::REQUEST_TIMEOUT,
        "body-timeout",
        "Request body too slow",
        "the request body paused for longer than the server waits (ONRAMP_HTTP_BODY_TIMEOUT)",
    )
    .into_response();
    let h = out.headers_mut();
    h.insert(header::CONNECTION, HeaderValue::from_static("close"));
    if let Some(id) = res.headers().get("x-request-id") {
        h.insert("x-request-id", id.clone());
    }
    out
}

/// Resolves (with the reason) when the connection is to be closed.
async fn watch(a: &Activity, s: &HttpSettings) -> &'static str {
    let stall = s.idle_timeout.max(s.timeout) + Duration::from_secs(1);
    let tick = (s.header_timeout.min(s.idle_timeout) / 4).clamp(Duration::from_millis(20), Duration::from_secs(1));
    let mut every = tokio::time::interval(tick);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let now = a.now();
        if a.busy.load(SeqCst) > 0 {
            if now.saturating_sub(a.last_io.load(SeqCst)) > millis(stall) {
                return "no byte moved while answering (the client stopped reading)";
            }
            continue;
        }
        match a.head_since.load(SeqCst) {
            0 if now.saturating_sub(a.idle_since.load(SeqCst)) > millis(s.idle_timeout) => {
                return "idle (ONRAMP_HTTP_IDLE_TIMEOUT)";
            }
            0 => {}
            first if now.saturating_sub(first - 1) > millis(s.header_timeout) => {
                return "request head incomplete (ONRAMP_HTTP_HEADER_TIMEOUT)";
            }
            _ => {}
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// What the watchdog knows of a connection; times in milliseconds since it was accepted.
struct Activity {
    start: Instant,
    /// The last byte read or written.
    last_io: AtomicU64,
    /// Requests being answered (from their head until their response's body is sent).
    busy: AtomicUsize,
    /// When the last request was answered (or the connection accepted).
    idle_since: AtomicU64,
    /// 1 + when the first byte of the next request came (or the connection was accepted); 0: none
    /// since the last answer.
    head_since: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        let zero = || AtomicU64::new(0);
        // a new connection owes its first request head at once: the header timeout runs from now
        let head_since = AtomicU64::new(1);
        Self { start: Instant::now(), last_io: zero(), busy: AtomicUsize::new(0), idle_since: zero(), head_since }
    }

    fn now(&self) -> u64 {
        millis(self.start.elapsed())
    }

    fn read(&self) {
        let now = self.now();
        self.last_io.store(now, SeqCst);
        if self.busy.load(SeqCst) == 0 {
            let _ = self.head_since.compare_exchange(0, now + 1, SeqCst, SeqCst);
        }
    }
}

/// Marks the connection busy while it lives.
struct Busy(Arc<Activity>);

impl Busy {
    fn enter(a: Arc<Activity>) -> Self {
        a.busy.fetch_add(1, SeqCst);
        a.head_since.store(0, SeqCst);
        Self(a)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let a = &self.0;
        a.idle_since.store(a.now(), SeqCst);
        a.head_since.store(0, SeqCst);
        a.busy.fetch_sub(1, SeqCst);
    }
}

/// The socket, noting every byte that moves.
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
}

impl AsyncRead for Tracked {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.activity.read();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        if n > 0 {
            this.activity.last_io.store(this.activity.now(), SeqCst);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A request body that fails when no frame arrives for `timeout` while it is being read.
struct SlowBody {
    inner: Incoming,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    stalled: Arc<AtomicBool>,
}

#[derive(Debug, thiserror::Error)]
#[error("the request body paused for longer than ONRAMP_HTTP_BODY_TIMEOUT")]
struct BodyStalled;

impl SlowBody {
    fn new(inner: Incoming, timeout: Duration, stalled: Arc<AtomicBool>) -> Self {
        Self { inner, timeout, sleep: None, stalled }
    }
}

impl HttpBody for SlowBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            this.sleep = None;
            return Poll::Ready(frame.map(|f| f.map_err(BoxError::from)));
        }
        let timeout = this.timeout;
        let sleep = this.sleep.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        ready!(sleep.as_mut().poll(cx));
        this.stalled.store(true, SeqCst);
        Poll::Ready(Some(Err(BodyStalled.into())))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that keeps its connection busy until it is sent (or dropped).
struct Guarded {
    inner: Body,
    _busy: Busy,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

//! The HTTP server's accept loop: HTTP/1.1 connections served by hyper, at most
//! `ONRAMP_HTTP_MAX_CONNECTIONS` at once (one more waits briefly for a free slot, then is closed),
//! each watched for slow and idle clients (`conn`). At shutdown no new connection is accepted,
//! idle ones close, and the requests in flight finish (bounded by the request timeout).

mod conn;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::HttpSettings;

/// How long a connection over the limit waits for a free slot before it is closed.
const SLOT_WAIT: Duration = Duration::from_secs(1);

/// Serves `router` on `listener` until `shutdown` is cancelled, then lets the connections finish.
pub(super) async fn run(
    listener: TcpListener,
    router: Router,
    settings: Arc<HttpSettings>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let max = settings.max_connections.clamp(1, u32::MAX as usize);
    let slots = Arc::new(Semaphore::new(max));
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) if transient(&e) => {
                    // out of file descriptors and the like: give the connections in flight a moment
                    tracing::warn!(error = %e, "HTTP accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
                Err(e) => return Err(e),
            },
        };
        let (slots, router, settings, shutdown) = (slots.clone(), router.clone(), settings.clone(), shutdown.clone());
        tokio::spawn(async move {
            let slot = match slots.clone().try_acquire_owned() {
                Ok(s) => s,
                Err(_) => match tokio::time::timeout(SLOT_WAIT, slots.acquire_owned()).await {
                    Ok(Ok(s)) => s,
                    _ => {
                        tracing::warn!(%peer, "HTTP connection closed: ONRAMP_HTTP_MAX_CONNECTIONS reached");
                        return;
                    }
                },
            };
            conn::serve(stream, peer, router, &settings, shutdown).await;
            drop(slot);
        });
    }
    drop(listener);
    // every connection holds a slot: all slots free means all connections are done
    let drain = settings.timeout + settings.body_timeout + Duration::from_secs(1);
    if tokio::time::timeout(drain, slots.acquire_many(max as u32)).await.is_err() {
        tracing::warn!("HTTP connections still open after the shutdown's wait; closing them");
    }
    Ok(())
}

/// Accept errors that concern one connection or a passing shortage, not the listener.
fn transient(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::*;
    matches!(e.kind(), ConnectionAborted | ConnectionReset | Interrupted | WouldBlock | OutOfMemory)
        || e.raw_os_error().is_some_and(|c| c == 23 || c == 24) // ENFILE, EMFILE
}

//! The delivering loop of a worker: takes due subscriptions by lease, delivers each one's events
//! in order, lets them go. No transaction is open during a POST.

use std::time::Duration;

use futures_util::future::join_all;
use tokio_util::sync::CancellationToken;

use super::deliver::{self, Outcome};
use super::log::{LoggedEvent, settled};
use super::store::{self, Advance, Held};
use super::{CallbackConfig, Engine, EngineError};

/// Subscriptions one worker delivers to at once.
const CONCURRENT: i64 = 16;
/// Events read per look.
const BATCH: i64 = 200;

pub async fn run(engine: Engine, cfg: CallbackConfig, shutdown: CancellationToken) {
    let http = match reqwest::Client::builder()
        .timeout(cfg.timeout)
        .connect_timeout(cfg.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .user_agent(concat!("onramp/", env!("CARGO_PKG_VERSION")))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "callbacks: no HTTP client; callbacks are not delivered by this worker");
            return;
        }
    };
    let lease = cfg.timeout * 2 + Duration::from_secs(5);
    loop {
        let held = match store::claim(engine.pool(), &cfg.worker, lease, CONCURRENT).await {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(error = %e, "callbacks: looking for due subscriptions failed");
                vec![]
            }
        };
        let busy = !held.is_empty();
        join_all(held.into_iter().map(|h| serve(&engine, &cfg, &http, lease, h, &shutdown))).await;
        if shutdown.is_cancelled() {
            return;
        }
        if !busy {
            tokio::select! {
                _ = tokio::time::sleep(cfg.poll) => {}
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

/// Delivers what is due of one subscription, then lets it go.
async fn serve(
    engine: &Engine,
    cfg: &CallbackConfig,
    http: &reqwest::Client,
    lease: Duration,
    h: Held,
    shutdown: &CancellationToken,
) {
    let id = h.id;
    if let Err(e) = deliver_due(engine, cfg, http, lease, h, shutdown).await {
        tracing::warn!(subscription = id, error = %e, "callbacks: delivering failed; trying again");
        let _ = store::release(engine.pool(), &cfg.worker, id, cfg.poll).await;
    }
}

async fn deliver_due(
    engine: &Engine,
    cfg: &CallbackConfig,
    http: &reqwest::Client,
    lease: Duration,
    h: Held,
    shutdown: &CancellationToken,
) -> Result<(), EngineError> {
    let pool = engine.pool();
    let events = engine.next_events(h.cursor, BATCH).await?;
    let ids: Vec<i64> = events.iter().map(|e| e.id).collect();
    let now = engine.now().await?;
    let (n, hold) = settled(h.cursor, &ids, h.hold, now, cfg.settle);
    let mut done = h.cursor;
    let mut attempts = u32::try_from(h.attempts).unwrap_or(0);
    for e in &events[..n] {
        if shutdown.is_cancelled() {
            break;
        }
        let Some(summary) = e.summary().filter(|_| wanted(&h, e)) else {
            continue;
        };
        let outcome = match deliver::post(http, &h.url, &h.secret, &summary).await {
            Outcome::Delivered => Advance::Delivered,
            Outcome::Failed { status, error, retry_after } => {
                attempts += 1;
                if attempts < cfg.max_attempts {
                    let wait = deliver::backoff(attempts, cfg.backoff, cfg.max_backoff, retry_after, fastrand::f64());
                    tracing::info!(subscription = h.id, event = e.id, attempt = attempts, %error, retry_in = ?wait, "callback failed; trying again later");
                    // the events before this one are done; this one waits for its next attempt
                    let failure = store::Failure { cursor: e.id - 1, attempts, status, error: &error, retry_in: wait };
                    return store::failed(pool, &cfg.worker, h.id, failure).await;
                }
                tracing::warn!(subscription = h.id, event = e.id, attempts, %error, "callback given up after its last attempt");
                Advance::GivenUp
            }
        };
        attempts = 0;
        done = e.id;
        if !store::advance(pool, &cfg.worker, h.id, done, None, lease, outcome).await? {
            tracing::warn!(subscription = h.id, "callbacks: the lease was lost; another worker goes on");
            return Ok(());
        }
    }
    // past the events not asked for, up to where the log is settled
    let end = if shutdown.is_cancelled() { done } else { ids[..n].last().copied().unwrap_or(done) };
    let hold = if end == ids[..n].last().copied().unwrap_or(h.cursor) { hold } else { None };
    store::advance(pool, &cfg.worker, h.id, end, hold, lease, Advance::Skipped).await?;
    // more may be waiting already: due again at once when the batch was full
    let again = if ids.len() as i64 == BATCH && n == ids.len() { Duration::ZERO } else { cfg.poll };
    store::release(pool, &cfg.worker, h.id, again).await
}

/// Whether the subscription asked for this event.
fn wanted(h: &Held, e: &LoggedEvent) -> bool {
    let Some(job) = &e.job else { return false };
    let name = format!("job.{}", e.to_state);
    h.events.contains(&name) && h.tenant.as_ref().is_none_or(|t| t == &job.tenant)
}

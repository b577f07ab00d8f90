//! A worker's background tasks: the batched result writer, the lease heartbeat and the
//! LISTEN loop that wakes idle claimers.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use sqlx::postgres::PgListener;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::JobState;
use super::kept::Kept;
use super::leases;
use super::store::{self, NOTIFY_CANCEL, NOTIFY_JOBS, StepWrite};
use super::worker::{MAX_BATCH, Shared};

/// Writes results in batches: whatever steps finished while the last batch was being written.
/// Ends when every sender is gone.
pub(super) async fn write_loop(s: Arc<Shared>, mut rx: mpsc::Receiver<(StepWrite, oneshot::Sender<bool>)>) {
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut conn = Kept::new(s.pool.clone());
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let writes: Vec<StepWrite> = batch.iter().map(|(w, _)| w.clone()).collect();
        let accepted = write_with_retry(&s, &mut conn, &writes).await;
        {
            let mut map = s.inflight.lock().expect("inflight lock");
            for w in &writes {
                // Only the entry of this attempt: a job written back as due now may have been
                // claimed again by this worker already, and that claim's entry is another's.
                let Some(f) = map.get_mut(&w.id).filter(|f| f.step_index == w.step_index && f.attempt == w.attempt)
                else {
                    continue;
                };
                if accepted.contains(&w.id) && w.new_state == JobState::Running {
                    f.step_index = w.new_step_index;
                    f.attempt = 1;
                } else {
                    map.remove(&w.id);
                }
            }
        }
        // A retry or timer written here may be due before the claimer's next look: let it recompute.
        if writes.iter().any(|w| matches!(w.new_state, JobState::Pending | JobState::Waiting)) {
            s.wake.notify_one();
        }
        for (w, reply) in batch.drain(..) {
            let _ = reply.send(accepted.contains(&w.id));
        }
    }
}

/// A result is worth retrying while the lease could still hold; after that it would be refused.
async fn write_with_retry(s: &Shared, conn: &mut Kept, writes: &[StepWrite]) -> Vec<i64> {
    let deadline = tokio::time::Instant::now() + s.cfg.lease;
    let mut pause = Duration::from_millis(50);
    loop {
        let written = match conn.get().await {
            Ok(c) => store::write_results(c, &s.cfg.id, writes).await,
            Err(e) => Err(e.into()),
        };
        match written {
            Ok(ids) => return ids,
            Err(e) => {
                conn.discard();
                s.stats.db_errors.fetch_add(1, Relaxed);
                if tokio::time::Instant::now() + pause > deadline {
                    tracing::error!(error = %e, steps = writes.len(), "could not write step results; their leases will expire and the steps run again");
                    return vec![];
                }
                tracing::warn!(error = %e, "writing step results failed; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(1));
            }
        }
    }
}

/// Renews the leases of running steps; stops steps whose job was cancelled or taken over.
pub(super) async fn heartbeat(shared: Arc<Shared>, stop: CancellationToken) {
    let every = shared.cfg.lease / 3;
    loop {
        tokio::select! { _ = tokio::time::sleep(every) => {}, _ = stop.cancelled() => return }
        let held: Vec<(i64, i32, i32)> = {
            let map = shared.inflight.lock().expect("inflight lock");
            map.iter().map(|(id, f)| (*id, f.step_index, f.attempt)).collect()
        };
        if held.is_empty() {
            continue;
        }
        match leases::renew(&shared.pool, &shared.cfg.id, shared.cfg.lease, &held).await {
            Ok(lost) => {
                let map = shared.inflight.lock().expect("inflight lock");
                for id in lost {
                    // the attempt that was renewed, not a later claim of the same job here
                    let renewed = held.iter().find(|h| h.0 == id).map(|h| (h.1, h.2));
                    if let Some(f) = map.get(&id).filter(|f| Some((f.step_index, f.attempt)) == renewed) {
                        shared.stats.leases_lost.fetch_add(1, Relaxed);
                        tracing::warn!(job = id, "lost the lease (cancelled or taken over): stopping the step");
                        f.cancel.cancel();
                    }
                }
            }
            Err(e) => {
                shared.stats.db_errors.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "lease renewal failed");
            }
        }
    }
}

/// LISTEN for new work and cancellations; reconnects by itself.
pub(super) async fn listen(shared: Arc<Shared>, stop: CancellationToken) {
    loop {
        let mut listener = match PgListener::connect_with(&shared.pool).await {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "LISTEN connection failed; polling meanwhile");
                tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => continue, _ = stop.cancelled() => return }
            }
        };
        if let Err(e) = listener.listen_all([NOTIFY_JOBS, NOTIFY_CANCEL]).await {
            tracing::warn!(error = %e, "LISTEN failed; polling meanwhile");
            tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => continue, _ = stop.cancelled() => return }
        }
        shared.wake.notify_one();
        loop {
            let n = tokio::select! { n = listener.recv() => n, _ = stop.cancelled() => return };
            match n {
                Ok(n) if n.channel() == NOTIFY_CANCEL => {
                    let id: i64 = n.payload().parse().unwrap_or(-1);
                    if let Some(f) = shared.inflight.lock().expect("inflight lock").get(&id) {
                        f.cancel.cancel();
                    }
                }
                Ok(_) => shared.wake.notify_one(),
                Err(e) => {
                    // sqlx reconnects on the next recv; notifications may have been missed meanwhile
                    tracing::warn!(error = %e, "LISTEN connection lost; reconnecting");
                    shared.wake.notify_one();
                    // a database that stays away must not turn this into a busy loop
                    tokio::select! { _ = tokio::time::sleep(Duration::from_secs(1)) => {}, _ = stop.cancelled() => return }
                }
            }
        }
    }
}

//! A worker's free slots, gathered for one claim.
//!
//! A claim has a fixed cost besides its jobs: the scan past the jobs other steps hold at the
//! front of the queue. In a backlog, slots come back in bursts (a batch of results commits, then
//! each of its steps gives its slot up one after the other), and a claim for the first free slot
//! alone paid that cost for one job: half of the claims draining 100,000 no-op jobs took one.
//! So in a backlog a claim waits a moment for the burst, up to a low-water mark of half the
//! slots, as graphile-worker's local queue refills at a low-water mark. Outside a backlog (the
//! worker waits for work) a free slot claims at once: the latency of a single job is untouched.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// How long a claim in a backlog waits for more of its slots to come free.
pub(super) const GATHER_FOR: Duration = Duration::from_millis(2);

/// Takes the slots free now, up to `max` in all.
pub(super) fn take_free(sem: &Arc<Semaphore>, permits: &mut Vec<OwnedSemaphorePermit>, max: usize) {
    while permits.len() < max {
        match sem.clone().try_acquire_owned() {
            Ok(p) => permits.push(p),
            Err(_) => break,
        }
    }
}

/// Waits up to `wait` until `permits` holds `low_water` slots, then takes any others free now
/// (up to `max`). False if `stop` was cancelled meanwhile.
pub(super) async fn gather(
    sem: &Arc<Semaphore>,
    permits: &mut Vec<OwnedSemaphorePermit>,
    low_water: usize,
    max: usize,
    wait: Duration,
    stop: &CancellationToken,
) -> bool {
    let deadline = tokio::time::sleep(wait);
    tokio::pin!(deadline);
    while permits.len() < low_water.min(max) {
        tokio::select! {
            p = sem.clone().acquire_owned() => permits.push(p.expect("semaphore is never closed")),
            _ = &mut deadline => break,
            _ = stop.cancelled() => return false,
        }
    }
    take_free(sem, permits, max);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    const LONG: Duration = Duration::from_secs(60);

    /// All of `n` slots held, as in a backlog; returns the semaphore and the held slots.
    fn busy(n: usize) -> (Arc<Semaphore>, Vec<OwnedSemaphorePermit>) {
        let sem = Arc::new(Semaphore::new(n));
        let held = (0..n).map(|_| sem.clone().try_acquire_owned().unwrap()).collect();
        (sem, held)
    }

    /// A claim starting in a backlog of `n` slots: one slot free (taken), the rest held.
    fn one_free_of(n: usize) -> (Arc<Semaphore>, Vec<OwnedSemaphorePermit>, Vec<OwnedSemaphorePermit>) {
        let (sem, mut held) = busy(n);
        drop(held.pop());
        let mut permits = vec![];
        take_free(&sem, &mut permits, n);
        (sem, held, permits)
    }

    #[tokio::test]
    async fn a_burst_of_slots_coming_free_one_by_one_is_claimed_together() {
        let (sem, mut held, mut permits) = one_free_of(8);
        assert_eq!(permits.len(), 1, "one slot free when the claim starts");
        // the rest of the burst: three more slots, one after the other, as a batch's steps reply
        let burst: Vec<_> = held.drain(..3).collect();
        let releaser = tokio::spawn(async move {
            for p in burst {
                tokio::task::yield_now().await;
                drop(p);
            }
        });
        let t0 = std::time::Instant::now();
        assert!(gather(&sem, &mut permits, 4, 8, LONG, &CancellationToken::new()).await);
        assert_eq!(permits.len(), 4, "claims the burst together");
        assert!(t0.elapsed() < LONG / 2, "returned at the low-water mark, not at the deadline");
        releaser.await.unwrap();
    }

    #[tokio::test]
    async fn a_claim_waits_no_longer_than_the_deadline_for_slots_that_stay_busy() {
        let (sem, _held, mut permits) = one_free_of(8);
        let t0 = std::time::Instant::now();
        assert!(gather(&sem, &mut permits, 4, 8, GATHER_FOR, &CancellationToken::new()).await);
        assert_eq!(permits.len(), 1, "claims with the one free slot");
        assert!(t0.elapsed() >= GATHER_FOR);
    }

    #[tokio::test]
    async fn slots_free_at_once_are_all_taken_up_to_the_maximum() {
        let sem = Arc::new(Semaphore::new(10));
        let mut permits = vec![];
        let t0 = std::time::Instant::now();
        assert!(gather(&sem, &mut permits, 2, 6, LONG, &CancellationToken::new()).await);
        assert_eq!(permits.len(), 6);
        assert!(t0.elapsed() < LONG / 2, "no wait when the slots are free");
    }

    #[tokio::test]
    async fn a_stopping_worker_stops_gathering() {
        let (sem, _held) = busy(4);
        let stop = CancellationToken::new();
        let stopper = stop.clone();
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            stopper.cancel();
        });
        let mut permits = vec![];
        assert!(!gather(&sem, &mut permits, 2, 4, LONG, &stop).await);
    }
}

//! The kills of scenario 1: `kill -9` of a replica at moments of given kinds, each found by
//! looking at the world (the api's intake progress, running steps in the database, a running
//! `sacctmgr add user a,b,…` in the trace, timers waiting), then the replica started again.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::world::World;
use crate::world::sender::Progress;
use crate::world::trace::SacctmgrTrace;

/// A moment to kill at.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Moment {
    /// The api replica while deliveries are arriving.
    IntakeApi,
    /// A worker while deliveries are arriving.
    IntakeWorker,
    /// The worker that runs a `sacctmgr add user a,b,…` (more than one user).
    MidBatch,
    /// A worker that holds the lease of a running step.
    MidStep,
    /// A worker while onboardings wait out the propagation timer.
    PropagationTimer,
    /// A worker while offboardings wait out the retention timer.
    Retention,
}

impl Moment {
    pub const ALL: [Moment; 6] = [
        Moment::IntakeApi,
        Moment::IntakeWorker,
        Moment::MidBatch,
        Moment::MidStep,
        Moment::PropagationTimer,
        Moment::Retention,
    ];
}

/// What was killed, by moment.
pub struct Kills {
    pub by_moment: BTreeMap<Moment, usize>,
    next_worker: usize,
    /// Where the `sacctmgr` calls running now are seen.
    trace: SacctmgrTrace,
}

impl Kills {
    pub fn new(trace: SacctmgrTrace) -> Self {
        Self { by_moment: BTreeMap::new(), next_worker: 0, trace }
    }

    /// A kill at one of `kinds`, the kind killed least so far first: each is waited for up to
    /// `each` before the next is tried. Returns the moment, or `None` if none came.
    pub async fn least_first(
        &mut self,
        w: &mut World,
        kinds: &[Moment],
        intake: &Progress,
        total: usize,
        each: Duration,
    ) -> Option<Moment> {
        let mut k = kinds.to_vec();
        k.sort_by_key(|m| self.by_moment.get(m).copied().unwrap_or(0));
        for m in k {
            if let Some(m) = self.at_one_of(w, &[m], intake, total, each).await {
                return Some(m);
            }
        }
        None
    }

    /// [`Self::at_one_of`] within a minute, or the test fails.
    pub async fn must(&mut self, w: &mut World, kinds: &[Moment], intake: &Progress, total: usize) {
        let m = self.at_one_of(w, kinds, intake, total, Duration::from_secs(60)).await;
        assert!(m.is_some(), "no moment of {kinds:?} came: {:?}", self.by_moment);
    }

    pub fn total(&self) -> usize {
        self.by_moment.values().sum()
    }

    /// Waits (polling every 20 ms, up to `deadline`) for a moment of one of `kinds`, kills the
    /// replica it names and starts it again. Returns the moment, or `None` if none came.
    pub async fn at_one_of(
        &mut self,
        w: &mut World,
        kinds: &[Moment],
        intake: &Progress,
        total: usize,
        deadline: Duration,
    ) -> Option<Moment> {
        let end = tokio::time::Instant::now() + deadline;
        while tokio::time::Instant::now() < end {
            for &m in kinds {
                if let Some(target) = self.find(w, m, intake, total).await {
                    self.kill(w, target).await;
                    *self.by_moment.entry(m).or_default() += 1;
                    return Some(m);
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    async fn find(&mut self, w: &World, m: Moment, intake: &Progress, total: usize) -> Option<Target> {
        let acked = intake.acknowledged.load(Ordering::Relaxed);
        let arriving = acked >= total / 5 && acked < total * 4 / 5;
        match m {
            Moment::IntakeApi => arriving.then_some(Target::Api),
            Moment::IntakeWorker => arriving.then(|| self.any_worker(w)),
            Moment::MidBatch => batch_writer(w, &self.trace),
            Moment::MidStep => running_step(w).await,
            Moment::PropagationTimer => {
                waiting(w, "user.onboard", "propagation_wait").await.then(|| self.any_worker(w))
            }
            Moment::Retention => waiting(w, "user.offboard", "retention").await.then(|| self.any_worker(w)),
        }
    }

    fn any_worker(&mut self, w: &World) -> Target {
        self.next_worker += 1;
        Target::Worker(self.next_worker % w.workers.len())
    }

    async fn kill(&self, w: &mut World, target: Target) {
        match target {
            Target::Api => {
                w.kill_api(0).await;
                w.restart_api(0).await;
            }
            Target::Worker(i) => {
                w.kill_worker(i).await;
                w.restart_worker(i).await;
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Target {
    Api,
    Worker(usize),
}

/// The worker whose `sacctmgr … add user a,b,…` is running now: in the trace, started by a live
/// worker and not ended.
fn batch_writer(w: &World, trace: &SacctmgrTrace) -> Option<Target> {
    let running = trace.calls().into_iter().filter(|c| c.is_batch() && c.end.is_none()).collect::<Vec<_>>();
    running.iter().find_map(|c| w.workers.iter().position(|p| p.pid() == Some(c.ppid))).map(Target::Worker)
}

/// A worker holding the live lease of a running step.
async fn running_step(w: &World) -> Option<Target> {
    let owner: Option<String> = sqlx::query_scalar(
        "select lease_owner from jobs where lease_owner is not null and lease_until > now()
         order by random() limit 1",
    )
    .fetch_optional(&w.db.pool)
    .await
    .ok()
    .flatten();
    let owner = owner?;
    (0..w.workers.len()).find(|i| owner == format!("onramp-worker-{i}")).map(Target::Worker)
}

/// Jobs of `kind` wait at `step`'s timer now.
async fn waiting(w: &World, kind: &str, step: &str) -> bool {
    let n: i64 = sqlx::query_scalar("select count(*) from jobs where kind = $1 and step = $2 and state = 'waiting'")
        .bind(kind)
        .bind(step)
        .fetch_one(&w.db.pool)
        .await
        .unwrap_or(0);
    n > 0
}

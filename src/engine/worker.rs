//! A worker: claims due steps in batches, runs them concurrently, renews their leases, and writes
//! their results in batches. No database transaction is open while a step runs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, Span};

use super::decide::{Situation, decide};
use super::kept::Kept;
use super::leases;
use super::slots;
use super::stats;
use super::store::{self, Claimed, StepWrite};
use super::trace;
use super::worker_tasks::{heartbeat, listen, write_loop};
use super::{Engine, Flow, JobState, Jobs, Registry, StepCtx, StepOutcome, Transition};

#[derive(Clone, Debug)]
pub struct WorkerConfig {
    /// Unique per process; recorded as the lease owner and in the audit trail.
    pub id: String,
    /// Steps run at once by this process.
    pub concurrency: usize,
    /// How long a claim holds without renewal; a dead worker's steps are claimable after it.
    pub lease: Duration,
    /// How often to look for due work when no notification arrives.
    pub poll_interval: Duration,
    /// At shutdown, how long running steps may take to finish before their leases are released.
    pub shutdown_grace: Duration,
}

/// Counters for /metrics.
#[derive(Debug, Default)]
pub struct WorkerStats {
    pub claimed: AtomicU64,
    pub reclaimed_writes_refused: AtomicU64,
    pub leases_lost: AtomicU64,
    pub steps_done: AtomicU64,
    pub steps_retried: AtomicU64,
    pub steps_failed: AtomicU64,
    pub db_errors: AtomicU64,
}

pub(super) struct InFlight {
    pub(super) step_index: i32,
    pub(super) attempt: i32,
    pub(super) cancel: CancellationToken,
}

pub(super) struct Shared {
    pub(super) pool: PgPool,
    pub(super) registry: Arc<Registry>,
    /// Given to each step: the engine's handle on other jobs.
    pub(super) jobs: Jobs,
    pub(super) cfg: WorkerConfig,
    pub(super) stats: Arc<WorkerStats>,
    pub(super) inflight: Mutex<HashMap<i64, InFlight>>,
    pub(super) wake: Notify,
    /// Set when the worker stops claiming; steps finish but do not continue to the next step.
    pub(super) stopping: CancellationToken,
    /// The last claim took as many steps as it asked for: more may be due than there are slots.
    /// A finished step then gives its slot up (its job's next step queues behind the steps that
    /// were due before it) instead of going on in it: breadth first, so that a thousand jobs
    /// reach a batched step together rather than one slot's worth at a time.
    pub(super) backlog: AtomicBool,
}

type Writes = mpsc::Sender<(StepWrite, oneshot::Sender<bool>)>;

pub(super) const MAX_BATCH: usize = 512;

/// Runs until `shutdown` is cancelled, then drains within the grace period and returns.
pub async fn run(
    engine: &Engine,
    cfg: WorkerConfig,
    stats: Arc<WorkerStats>,
    shutdown: CancellationToken,
) -> Result<(), super::EngineError> {
    let (tx, rx) = mpsc::channel(4 * MAX_BATCH);
    let shared = Arc::new(Shared {
        pool: engine.pool().clone(),
        registry: engine.registry().clone(),
        jobs: Jobs::new(engine.clone()),
        cfg,
        stats,
        inflight: Mutex::default(),
        wake: Notify::new(),
        stopping: shutdown.clone(),
        backlog: AtomicBool::new(false),
    });
    let background = CancellationToken::new();
    let listener = tokio::spawn(listen(shared.clone(), background.clone()));
    let heartbeat = tokio::spawn(heartbeat(shared.clone(), background.clone()));
    let writer = tokio::spawn(write_loop(shared.clone(), rx));
    let sem = Arc::new(Semaphore::new(shared.cfg.concurrency));
    let mut tasks = JoinSet::new();
    tracing::info!(worker = %shared.cfg.id, concurrency = shared.cfg.concurrency, lease = ?shared.cfg.lease, "worker started");

    claim_loop(&shared, &tx, &sem, &mut tasks, &shutdown).await;

    // Drain: running steps may finish within the grace period.
    let grace = shared.cfg.shutdown_grace;
    let all = u32::try_from(shared.cfg.concurrency).unwrap_or(u32::MAX);
    let drained = tokio::time::timeout(grace, sem.acquire_many(all)).await.is_ok();
    if !drained {
        let held: Vec<(i64, i32, i32)> = {
            let map = shared.inflight.lock().expect("inflight lock");
            map.iter().map(|(id, f)| (*id, f.step_index, f.attempt)).collect()
        };
        tracing::warn!(steps = held.len(), "grace period over: stopping running steps and releasing their leases");
        for f in shared.inflight.lock().expect("inflight lock").values() {
            f.cancel.cancel();
        }
        while tasks.join_next().await.is_some() {}
        match leases::release(&shared.pool, &shared.cfg.id, &held).await {
            Ok(n) => tracing::info!(released = n, "leases released"),
            Err(e) => {
                tracing::error!(error = %e, "could not release leases; they expire by themselves")
            }
        }
    }
    while tasks.join_next().await.is_some() {}
    // Every task has ended; with the last sender gone the writer drains and stops.
    drop(tx);
    let _ = writer.await;
    background.cancel();
    let _ = tokio::join!(listener, heartbeat);
    tracing::info!("worker stopped");
    Ok(())
}

async fn claim_loop(
    shared: &Arc<Shared>,
    writes: &Writes,
    sem: &Arc<Semaphore>,
    tasks: &mut JoinSet<()>,
    stop: &CancellationToken,
) {
    // only the kinds this process runs: declared-only kinds are left to the workers that run them
    let kinds = shared.registry.runnable_kinds();
    let mut db_backoff = Duration::from_millis(100);
    // when this worker last looked at the statistics of `jobs`
    let mut stats_checked = None;
    let mut conn = Kept::new(shared.pool.clone());
    loop {
        let first = tokio::select! {
            p = sem.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = stop.cancelled() => return,
        };
        let mut permits = vec![first];
        slots::take_free(sem, &mut permits, MAX_BATCH);
        if shared.backlog.load(Relaxed) {
            let low_water = shared.cfg.concurrency / 2;
            if !slots::gather(sem, &mut permits, low_water, MAX_BATCH, slots::GATHER_FOR, stop).await {
                return;
            }
        }
        let asked = permits.len();
        let claimed_at = time::OffsetDateTime::now_utc();
        let claimed = match claim(&mut conn, shared, &kinds, asked).await {
            Ok(c) => {
                db_backoff = Duration::from_millis(100);
                c
            }
            Err(e) => {
                conn.discard();
                shared.stats.db_errors.fetch_add(1, Relaxed);
                tracing::warn!(error = %e, "claim failed; trying again");
                drop(permits);
                tokio::select! { _ = tokio::time::sleep(db_backoff) => {}, _ = stop.cancelled() => return }
                db_backoff = (db_backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let got = claimed.len();
        shared.stats.claimed.fetch_add(got as u64, Relaxed);
        shared.backlog.store(got == asked, Relaxed);
        if got == asked {
            // a burst: the plans of the next claims and writes are only as good as the statistics
            stats::after_backlog(&shared.pool, &mut stats_checked);
        }
        for (c, permit) in claimed.into_iter().zip(permits.drain(..)) {
            let cancel = CancellationToken::new();
            shared
                .inflight
                .lock()
                .expect("inflight lock")
                .insert(c.id, InFlight { step_index: c.step_index, attempt: c.attempt, cancel: cancel.clone() });
            tasks.spawn(run_job(shared.clone(), writes.clone(), c, cancel, permit));
        }
        drop(permits);
        while tasks.try_join_next().is_some() {}
        if got == asked {
            continue;
        }
        // Nothing more is due now: sleep until the next timer, a notification, or the poll interval.
        let until = match store::next_due(&shared.pool, claimed_at).await {
            Ok(Some(d)) => d.min(shared.cfg.poll_interval),
            Ok(None) => shared.cfg.poll_interval,
            Err(e) => {
                tracing::warn!(error = %e, "looking up the next due time failed");
                shared.cfg.poll_interval
            }
        };
        tokio::select! {
            _ = shared.wake.notified() => {}
            _ = tokio::time::sleep(until) => {}
            _ = stop.cancelled() => return,
        }
    }
}

async fn claim(conn: &mut Kept, s: &Shared, kinds: &[&str], n: usize) -> Result<Vec<Claimed>, super::EngineError> {
    store::claim(conn.get().await?, &s.cfg.id, s.cfg.lease, kinds, n).await
}

async fn run_job(
    shared: Arc<Shared>,
    writes: Writes,
    mut c: Claimed,
    mut cancel: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let Some(flow) = shared.registry.get(&c.kind).cloned() else {
        // claim only takes the kinds this worker knows
        shared.inflight.lock().expect("inflight lock").remove(&c.id);
        return;
    };
    loop {
        let steps = flow.steps();
        let idx = c.step_index as usize;
        if idx >= steps.len() {
            tracing::error!(job = c.id, step_index = idx, "step index beyond the flow's steps");
            shared.inflight.lock().expect("inflight lock").remove(&c.id);
            return;
        }
        let policy = flow.policy(idx);
        let ctx = StepCtx {
            job_id: c.id,
            job_created: c.created_at,
            kind: c.kind.clone(),
            subject: c.subject.clone(),
            input: c.input.clone(),
            outputs: c.outputs.clone(),
            step: steps[idx],
            step_index: idx,
            attempt: (c.attempt - c.attempt_floor).max(1) as u32,
            waited: c.step_waited,
            poll_deadline: c.poll_deadline,
            approved_by: c.approved_by.clone(),
            cancel: cancel.clone(),
            jobs: Some(shared.jobs.clone()),
        };
        let poll_expired = ctx.poll_expired();
        let span = trace::step_span(&c, steps[idx]);
        let Some((t, effects)) = run_step(flow.clone(), idx, ctx, policy.timeout, &cancel, &span).await else {
            tracing::info!(parent: &span, "step stopped: the job was cancelled or the lease lost");
            return;
        };
        let situation = Situation {
            claimed: &c,
            steps,
            policy,
            lease: shared.cfg.lease,
            continue_here: !shared.stopping.is_cancelled() && !shared.backlog.load(Relaxed),
            poll_expired,
            jitter: fastrand::f64(),
        };
        let mut write = decide(&situation, t);
        if write.outcome == StepOutcome::NeedsApproval && flow.four_eyes(idx) {
            // recorded while this worker holds the job, so no approval can come in between
            if let Err(e) = super::ops::mark_four_eyes(&shared.pool, c.id, c.step_index, c.attempt).await {
                write = decide(&situation, Transition::Retry(format!("record that the approval needs four eyes: {e}")));
            }
        }
        write.effects = (!effects.is_empty()).then_some(serde_json::Value::Array(effects));
        trace::record_outcome(&span, write.outcome);
        match write.outcome {
            StepOutcome::Done => shared.stats.steps_done.fetch_add(1, Relaxed),
            StepOutcome::Retry => shared.stats.steps_retried.fetch_add(1, Relaxed),
            StepOutcome::Fail => shared.stats.steps_failed.fetch_add(1, Relaxed),
            _ => 0,
        };
        let (reply, accepted) = oneshot::channel();
        let next =
            (write.new_state == JobState::Running).then(|| (write.new_step_index, write.step, write.output.clone()));
        if let Some(err) = &write.error {
            tracing::info!(parent: &span, outcome = write.outcome.as_str(), error = %err, "step finished");
        } else {
            tracing::debug!(parent: &span, outcome = write.outcome.as_str(), "step finished");
        }
        if writes.send((write, reply)).await.is_err() || !accepted.await.unwrap_or(false) {
            shared.stats.reclaimed_writes_refused.fetch_add(1, Relaxed);
            tracing::warn!(parent: &span, "result refused: the job was cancelled or another worker holds it now");
            return;
        }
        let Some((new_index, done_step, output)) = next else {
            return;
        };
        // The result is committed and the lease extended: go on with the next step here.
        c.outputs.insert(done_step.to_string(), output.unwrap_or_default());
        c.step_index = new_index;
        c.attempt = 1;
        c.attempt_floor = 0;
        c.step_waited = false;
        c.poll_deadline = None;
        c.approved_by = None;
        match shared.inflight.lock().expect("inflight lock").get(&c.id) {
            Some(f) => cancel = f.cancel.clone(),
            None => return,
        }
    }
}

/// Runs one attempt in its own task, so a panic becomes a retryable error and a cancelled job
/// stops the step. `None` when the step was stopped.
async fn run_step(
    flow: Arc<dyn Flow>,
    idx: usize,
    ctx: StepCtx,
    timeout: Duration,
    cancel: &CancellationToken,
    span: &Span,
) -> Option<(Transition, Vec<serde_json::Value>)> {
    let step = ctx.step;
    let run = crate::effects::collect(async move { flow.run(idx, &ctx).await });
    let mut handle = tokio::spawn(run.instrument(span.clone()));
    tokio::select! {
        r = tokio::time::timeout(timeout, &mut handle) => Some(match r {
            Ok(Ok(done)) => done,
            Ok(Err(e)) if e.is_panic() => {
                let p = e.into_panic();
                let msg = p.downcast_ref::<&str>().map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                (Transition::Retry(format!("step {step} panicked: {msg}")), vec![])
            }
            Ok(Err(_)) => (Transition::Retry(format!("step {step} was aborted")), vec![]),
            Err(_) => {
                handle.abort();
                (Transition::Retry(format!("step {step} timed out after {timeout:?}")), vec![])
            }
        }),
        _ = cancel.cancelled() => {
            handle.abort();
            None
        }
    }
}

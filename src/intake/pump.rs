//! The pump: stored deliveries become reconcile jobs off the request path. Each round is one
//! transaction: it takes up to a batch of pending deliveries, oldest first (`for update skip
//! locked`, so several pumps share the work and none does it twice), computes their reconcile
//! jobs from the stored targets, **coalesces** them per subject (one job per dedupe key in the
//! batch, and the engine's dedupe folds a key into its pending job; a started holder gets one
//! job queued behind it, as before), enqueues them in bulk and marks the deliveries processed in
//! the same transaction. A kill -9 anywhere leaves every delivery either processed with its jobs
//! or pending, and a pump started later takes it.
//!
//! A delivery is pending while its id is in `webhook_deliveries_pending` (migration 0029): the
//! writer adds it in the statement that stores the delivery; a round locks the ids it takes there
//! and deletes them as it marks their deliveries processed, a HOT update (no indexed column
//! changes). The deliveries its own process's writer stored are handed to it by id
//! ([`Handoff`]): a round of those looks them up by primary key. The scan of every pending
//! delivery runs at start and on the poll, for what other processes stored and what a killed
//! process left: under a steady intake a scan per write cost more than the rest of the round
//! (2.4 ms a round at 3,500 deliveries/s).
//!
//! A delivery whose jobs PostgreSQL refuses never holds up the others: a failed round is done
//! again in halves until the failing delivery is alone; it is then marked processed with the
//! reason (refused for good) or left pending and skipped for a while (a passing failure).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use serde_json::Value;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

pub use super::handoff::Handoff;
use super::writer::{WriteError, classify, connection_failed};
use crate::domain::tenants::TenantRegistry;
use crate::engine::{Engine, EngineError, NewJob};
use crate::flows::reconcile::{Subject, jobs_for_subjects};

/// Most jobs enqueued in one round: each takes an advisory lock on its subject until commit, and
/// PostgreSQL's lock table is shared by every session. A delivery with more goes alone (the
/// intake bounds a delivery's jobs by `max_diff_users`).
pub const JOBS_PER_ROUND: usize = 1024;

/// Counters for /metrics.
#[derive(Debug, Default)]
pub struct PumpStats {
    /// Transactions that processed deliveries.
    pub rounds: AtomicU64,
    pub processed: AtomicU64,
    /// Jobs created by the pump.
    pub jobs_created: AtomicU64,
    /// A delivery's jobs that added nothing: folded into one of the batch or a pending job.
    pub coalesced: AtomicU64,
    /// Deliveries whose jobs PostgreSQL refused (processed with the reason).
    pub refused: AtomicU64,
    /// Rounds that failed (retried later).
    pub errors: AtomicU64,
}

impl PumpStats {
    pub fn render(&self, out: &mut String, pending: Option<i64>) {
        use std::fmt::Write;
        if let Some(n) = pending {
            let _ = writeln!(
                out,
                "# HELP onramp_webhook_deliveries_pending Stored deliveries the pump has not processed yet.\n# TYPE onramp_webhook_deliveries_pending gauge\nonramp_webhook_deliveries_pending {n}"
            );
        }
        for (name, help, v) in [
            ("onramp_pump_rounds_total", "Pump transactions that processed deliveries.", &self.rounds),
            ("onramp_pump_deliveries_total", "Deliveries processed into reconcile jobs.", &self.processed),
            ("onramp_pump_jobs_created_total", "Reconcile jobs the pump created.", &self.jobs_created),
            ("onramp_pump_jobs_coalesced_total", "Reconcile jobs of deliveries folded into another.", &self.coalesced),
            ("onramp_pump_refused_total", "Deliveries whose jobs PostgreSQL refused.", &self.refused),
            ("onramp_pump_errors_total", "Pump rounds that failed and are retried.", &self.errors),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
        }
    }
}

/// Stored deliveries not yet processed.
pub async fn pending(engine: &Engine) -> Result<i64, EngineError> {
    Ok(sqlx::query_scalar("select count(*) from webhook_deliveries_pending").fetch_one(engine.pool()).await?)
}

/// One pump; start one in every process that has the intake configured.
#[derive(Clone)]
pub struct Pump {
    pub engine: Engine,
    pub tenants: Arc<TenantRegistry>,
    /// Reconcile jobs are due this long after their delivery arrived.
    pub settle: Duration,
    /// Most deliveries per round.
    pub batch: usize,
    /// Scans for deliveries other processes stored (or a killed one left) this often; its own
    /// writer hands it what it stored.
    pub poll: Duration,
    /// What this process's writer stored (and the wake-up).
    pub handoff: Arc<Handoff>,
    pub stats: Arc<PumpStats>,
}

/// What one round did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Round {
    /// Pending deliveries it took (processed, or left for a later round).
    pub taken: usize,
    pub processed: usize,
    /// Those it took and left for a later round (past the most jobs of one round).
    pub left: Vec<Uuid>,
}

/// A delivery as the pump reads it.
type Row = (Uuid, Value, OffsetDateTime, Option<String>);

impl Pump {
    /// Runs until `shutdown`: drains what is pending (a scan), then takes what its writer hands
    /// it as it comes, and scans again every poll (also while it is handed work).
    pub async fn run(self, shutdown: CancellationToken) {
        // deliveries whose jobs failed alone for a passing reason: not before this, backoff
        let mut deferred: HashMap<Uuid, (Instant, Duration)> = HashMap::new();
        let mut next_scan = Instant::now();
        loop {
            // forget a deferral well after it ended (one failing again is deferred anew, longer)
            let now = Instant::now();
            deferred.retain(|_, (until, backoff)| now < *until + *backoff * 2 + Duration::from_secs(10));
            let drained = if now >= next_scan {
                next_scan = now + self.poll;
                self.drain(&mut deferred).await
            } else {
                self.handed(&mut deferred).await
            };
            match drained {
                Ok(()) if !self.handoff.is_empty() => continue,
                Ok(()) => {}
                Err(e) => {
                    self.stats.errors.fetch_add(1, Relaxed);
                    tracing::error!(error = %e, "the delivery pump failed; trying again");
                    // what failed is pending still: the next scan takes it
                    next_scan = Instant::now() + self.poll;
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = self.handoff.woken() => {}
                _ = tokio::time::sleep_until(next_scan.into()) => {}
            }
        }
    }

    /// Rounds of the deliveries the writer handed over, by id, until none is left. A round that
    /// fails is done again by a scan (which isolates the failing delivery).
    ///
    /// Short of a batch, a round first lingers a quarter of the settle time (at most 100 ms) for
    /// more: the jobs are not due before the settle time anyway, and one round of many costs the
    /// database far less than many rounds of a few (and coalesces more of a storm).
    async fn handed(&self, deferred: &mut HashMap<Uuid, (Instant, Duration)>) -> Result<(), EngineError> {
        let linger = (self.settle / 4).min(Duration::from_millis(100));
        loop {
            let waiting = self.handoff.len();
            if waiting == 0 {
                return Ok(());
            }
            if !linger.is_zero() && waiting < self.batch {
                tokio::time::sleep(linger).await;
            }
            let ids = self.handoff.take(self.batch);
            match self.round(Some(&ids), &[]).await {
                // past the most jobs of one round: the rest go first in the next
                Ok(r) => self.handoff.hand_back(r.left),
                Err(e) => {
                    tracing::debug!(error = %e, "a round of handed deliveries failed: scanning for them");
                    return self.drain(deferred).await;
                }
            }
        }
    }

    /// Rounds of a scan until fewer than a batch are pending.
    async fn drain(&self, deferred: &mut HashMap<Uuid, (Instant, Duration)>) -> Result<(), EngineError> {
        loop {
            let now = Instant::now();
            let skip: Vec<Uuid> = deferred.iter().filter(|(_, (until, _))| *until > now).map(|(id, _)| *id).collect();
            let taken = match self.round(None, &skip).await {
                Ok(r) => r.taken,
                Err(e) if connection_failed(&e) => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "a round of the delivery pump failed: processing it in halves");
                    self.isolate(&skip, deferred).await?
                }
            };
            if taken < self.batch {
                return Ok(());
            }
        }
    }

    /// After a failed round: the same deliveries again in halves until the failing one is alone.
    /// Returns how many it took.
    async fn isolate(
        &self,
        skip: &[Uuid],
        deferred: &mut HashMap<Uuid, (Instant, Duration)>,
    ) -> Result<usize, EngineError> {
        let ids: Vec<Uuid> = sqlx::query_scalar(
            "select id from webhook_deliveries_pending where not (id = any($2)) order by id limit $1",
        )
        .bind(self.batch as i64)
        .bind(skip)
        .fetch_all(self.engine.pool())
        .await?;
        let mut todo = vec![ids.as_slice()];
        while let Some(part) = todo.pop() {
            match self.round(Some(part), &[]).await {
                Ok(_) => {}
                Err(e) if connection_failed(&e) => return Err(e),
                Err(e) if part.len() > 1 => {
                    let (a, b) = part.split_at(part.len() / 2);
                    tracing::debug!(error = %e, n = part.len(), "delivery pump: halving");
                    todo.push(b);
                    todo.push(a);
                }
                Err(e) => match classify(&e) {
                    WriteError::Refused(why) => {
                        tracing::warn!(delivery = %part[0], error = %why, "PostgreSQL refuses a delivery's reconcile jobs");
                        self.refuse(part[0], &why).await?;
                    }
                    _ => {
                        let backoff = deferred.get(&part[0]).map_or(Duration::from_secs(1), |d| d.1 * 2);
                        let backoff = backoff.min(Duration::from_secs(300));
                        tracing::warn!(delivery = %part[0], error = %e, ?backoff, "a delivery's reconcile jobs failed; trying it later");
                        deferred.insert(part[0], (Instant::now() + backoff, backoff));
                    }
                },
            }
        }
        Ok(ids.len())
    }

    /// Marks a delivery processed without jobs, with why.
    async fn refuse(&self, id: Uuid, why: &str) -> Result<(), EngineError> {
        sqlx::query(
            "with done as (delete from webhook_deliveries_pending where id = $1 returning id)
             update webhook_deliveries d set processed_at = now(), job_ids = '{}', pump_error = $2
             from done where d.id = done.id",
        )
        .bind(id)
        .bind(why)
        .execute(self.engine.pool())
        .await?;
        self.stats.refused.fetch_add(1, Relaxed);
        self.stats.processed.fetch_add(1, Relaxed);
        Ok(())
    }

    /// One transaction: the pending deliveries `only` (or the oldest batch, but none of `skip`)
    /// that no other pump holds → their jobs, coalesced and enqueued → marked processed.
    pub async fn round(&self, only: Option<&[Uuid]>, skip: &[Uuid]) -> Result<Round, EngineError> {
        let mut tx = self.engine.pool().begin().await?;
        // the pending ids locked (those another pump holds are skipped), then their deliveries;
        // by primary key, or the scan of every pending id (two statements: one generic plan for
        // both would not know which)
        let rows: Vec<Row> = match only {
            Some(ids) => sqlx::query_as(
                "select d.id, d.targets, d.received_at, d.traceparent
                 from webhook_deliveries_pending p join webhook_deliveries d on d.id = p.id
                 where p.id = any($1) order by p.id for update of p skip locked",
            )
            .bind(ids),
            None => sqlx::query_as(
                "select d.id, d.targets, d.received_at, d.traceparent
                 from webhook_deliveries_pending p join webhook_deliveries d on d.id = p.id
                 where not (p.id = any($2)) order by p.id limit $1 for update of p skip locked",
            )
            .bind(self.batch as i64)
            .bind(skip),
        }
        .fetch_all(&mut *tx)
        .await?;
        if rows.is_empty() {
            return Ok(Round::default());
        }
        let taken = rows.len();
        // each delivery's jobs, up to the bound of one round (the rest wait for the next)
        let mut per: Vec<(Uuid, Vec<NewJob>)> = vec![];
        let mut left = vec![];
        let mut count = 0;
        for (id, targets, received_at, traceparent) in rows {
            if !left.is_empty() {
                left.push(id);
                continue;
            }
            let jobs = self.jobs_of(id, &targets, received_at, traceparent);
            if !per.is_empty() && count + jobs.len() > JOBS_PER_ROUND {
                left.push(id);
                continue;
            }
            count += jobs.len();
            per.push((id, jobs));
        }
        let mut keys: Vec<&str> =
            per.iter().flat_map(|(_, js)| js.iter().filter_map(|j| j.dedupe_key.as_deref())).collect();
        keys.sort_unstable();
        keys.dedup();
        let holders = self.engine.started_holders_in(&mut tx, &keys).await?;

        // one job per dedupe key in the batch (the oldest delivery's); a key whose job has
        // started already gets one queued behind it (that job may have read Authentik before)
        let mut jobs: Vec<NewJob> = vec![];
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut owned: Vec<Vec<usize>> = vec![];
        let mut folded = 0u64;
        for (_, js) in &per {
            let mut mine = vec![];
            for mut j in js.iter().cloned() {
                if let Some(held) = j.dedupe_key.as_deref().and_then(|k| holders.get(k)) {
                    j.dedupe_key = Some(format!("{}:after:{held}", j.dedupe_key.as_deref().unwrap_or_default()));
                }
                let at = match j.dedupe_key.clone() {
                    Some(k) => match index.get(&k) {
                        Some(&at) => {
                            folded += 1;
                            at
                        }
                        None => {
                            index.insert(k, jobs.len());
                            jobs.push(j);
                            jobs.len() - 1
                        }
                    },
                    None => {
                        jobs.push(j);
                        jobs.len() - 1
                    }
                };
                if !mine.contains(&at) {
                    mine.push(at);
                }
            }
            owned.push(mine);
        }
        let enqueued = self.engine.enqueue_in(&mut tx, &jobs).await?;
        let created = enqueued.iter().filter(|e| e.created).count() as u64;
        folded += enqueued.iter().filter(|e| !e.created).count() as u64;
        let ids: Vec<Uuid> = per.iter().map(|(id, _)| *id).collect();
        let job_ids: Vec<String> = owned
            .iter()
            .map(|mine| {
                let list: Vec<String> = mine.iter().map(|&at| enqueued[at].id.to_string()).collect();
                format!("{{{}}}", list.join(","))
            })
            .collect();
        sqlx::query(
            "with done as (delete from webhook_deliveries_pending where id = any($1))
             update webhook_deliveries d set processed_at = now(), job_ids = v.jobs::bigint[]
             from unnest($1::uuid[], $2::text[]) as v(id, jobs) where d.id = v.id",
        )
        .bind(&ids)
        .bind(&job_ids)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.stats.rounds.fetch_add(1, Relaxed);
        self.stats.processed.fetch_add(ids.len() as u64, Relaxed);
        self.stats.jobs_created.fetch_add(created, Relaxed);
        self.stats.coalesced.fetch_add(folded, Relaxed);
        tracing::debug!(deliveries = ids.len(), jobs = jobs.len(), created, "deliveries pumped");
        Ok(Round { taken, processed: ids.len(), left })
    }

    /// A stored delivery's reconcile jobs: from its targets, due `settle` after it arrived, in
    /// its request's trace. A target it cannot read means "cannot tell": everything.
    fn jobs_of(&self, id: Uuid, targets: &Value, received_at: OffsetDateTime, tp: Option<String>) -> Vec<NewJob> {
        let subjects: Vec<Subject> = targets
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|t| {
                t.as_str().and_then(Subject::from_target).unwrap_or_else(|| {
                    tracing::warn!(delivery = %id, target = %t, "a stored target the pump cannot read: reconciling everything");
                    Subject::Everything
                })
            })
            .collect();
        let due = (!self.settle.is_zero()).then(|| received_at + self.settle);
        let mut jobs = jobs_for_subjects(&subjects, &self.tenants, &id.to_string(), due);
        for j in &mut jobs {
            j.traceparent = tp.clone();
        }
        jobs
    }
}

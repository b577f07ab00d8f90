//! The periodic retention task of a worker process: finished jobs (with their attempts and audit
//! trail) and stored webhook deliveries older than their settings are deleted, a batch per
//! statement, at start and then every `ONRAMP_RETENTION_INTERVAL`. Several replicas may run it
//! at once: each batch skips the rows another one holds. Before it prunes deliveries, each round
//! sets the list of pending deliveries right (what replicas of a release before migration 0029
//! left while the Deployments rolled), so no stored delivery waits unprocessed past a round.

use std::time::Duration;

use anyhow::bail;
use tokio_util::sync::CancellationToken;

use crate::app::cli::WorkerArgs;
use crate::engine::{Engine, Pruned};
use crate::intake::retention::{prune_deliveries, repair_pending_list};

/// Jobs per statement (each with its few step runs and events: a few thousand rows).
const JOB_BATCH: u32 = 500;
/// Deliveries per statement.
const DELIVERY_BATCH: u32 = 2000;
/// An API idempotency key answers with its job for 24 hours; a resent delivery is a duplicate
/// while the first is kept. Neither may be pruned sooner.
const FLOOR: Duration = Duration::from_secs(86_400);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub jobs: Duration,
    pub deliveries: Duration,
    /// Zero: never pruned.
    pub every: Duration,
}

impl Retention {
    pub fn from_args(a: &WorkerArgs) -> anyhow::Result<Self> {
        if a.retention_jobs < FLOOR {
            bail!(
                "ONRAMP_RETENTION_JOBS must be at least 1d: an API idempotency key answers with its job for 24 hours"
            );
        }
        if a.retention_deliveries < FLOOR {
            bail!(
                "ONRAMP_RETENTION_DELIVERIES must be at least 1d: duplicates are recognised only while the first is kept"
            );
        }
        Ok(Self { jobs: a.retention_jobs, deliveries: a.retention_deliveries, every: a.retention_interval })
    }
}

/// What one round deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Round {
    pub jobs: Pruned,
    pub deliveries: u64,
    /// Unprocessed deliveries that were not listed as pending, listed.
    pub relisted: u64,
    /// Pending-list entries of a processed or deleted delivery, removed.
    pub unlisted: u64,
}

/// Deletes everything due, batch after batch, until nothing is left or `stop` is cancelled.
pub async fn prune(engine: &Engine, r: &Retention, stop: &CancellationToken) -> anyhow::Result<Round> {
    let mut out = Round::default();
    while !stop.is_cancelled() {
        let p = engine.prune_jobs(r.jobs, JOB_BATCH).await?;
        out.jobs.jobs += p.jobs;
        out.jobs.step_runs += p.step_runs;
        out.jobs.job_events += p.job_events;
        if p.jobs < u64::from(JOB_BATCH) {
            break;
        }
    }
    if !stop.is_cancelled() {
        (out.relisted, out.unlisted) = repair_pending_list(engine.pool()).await?;
    }
    while !stop.is_cancelled() {
        let n = prune_deliveries(engine.pool(), r.deliveries, DELIVERY_BATCH).await?;
        out.deliveries += n;
        if n < u64::from(DELIVERY_BATCH) {
            break;
        }
    }
    Ok(out)
}

/// Prunes at start and then every `r.every` until `shutdown`; zero turns it off.
pub async fn periodic_retention(engine: Engine, r: Retention, shutdown: CancellationToken) {
    if r.every.is_zero() {
        return;
    }
    loop {
        match prune(&engine, &r, &shutdown).await {
            Ok(n) => log(&n),
            Err(e) => tracing::warn!(error = %e, "retention: pruning failed; trying again at the next round"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(r.every) => {}
        }
    }
}

fn log(n: &Round) {
    if n.relisted + n.unlisted > 0 {
        tracing::info!(
            relisted = n.relisted,
            unlisted = n.unlisted,
            "retention: set the list of pending deliveries right (replicas of a release before migration 0029 ran)"
        );
    }
    if n.jobs != Pruned::default() || n.deliveries > 0 {
        tracing::info!(
            jobs = n.jobs.jobs,
            step_runs = n.jobs.step_runs,
            job_events = n.jobs.job_events,
            deliveries = n.deliveries,
            "retention: pruned finished jobs and old deliveries"
        );
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Args {
        #[command(flatten)]
        worker: WorkerArgs,
    }

    fn parse(args: &[&str]) -> anyhow::Result<Retention> {
        let a = Args::try_parse_from(std::iter::once("onramp").chain(args.iter().copied()))?;
        Retention::from_args(&a.worker)
    }

    #[test]
    fn defaults_and_floors_name_their_setting() {
        let r = parse(&[]).unwrap();
        assert_eq!((r.jobs.as_secs(), r.deliveries.as_secs(), r.every.as_secs()), (90 * 86_400, 14 * 86_400, 3600));
        let e = parse(&["--retention-jobs", "12h"]).unwrap_err().to_string();
        assert!(e.starts_with("ONRAMP_RETENTION_JOBS must be at least 1d"), "{e}");
        let e = parse(&["--retention-deliveries", "1h"]).unwrap_err().to_string();
        assert!(e.starts_with("ONRAMP_RETENTION_DELIVERIES must be at least 1d"), "{e}");
        assert_eq!(parse(&["--retention-interval", "0s"]).unwrap().every, Duration::ZERO);
    }
}

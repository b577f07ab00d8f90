//! The durable step engine. It knows jobs, steps, leases, timers and the audit trail, and nothing
//! about onboarding: flows are registered as [`Flow`]s and only return [`Transition`]s.
//!
//! A job is a row in `jobs` pointing at its current step; each attempt of a step is a row in
//! `step_runs`, written when the attempt ends (the open one is in the job's row, see `attempts`);
//! each state change is a row in `job_events`. Workers claim due steps with
//! `FOR UPDATE SKIP LOCKED` and a lease, run them with no transaction open, and write the result
//! fenced by the attempt number. Timers are `run_at` values, so they survive restarts. A lease is
//! `lease_owner` and `lease_until`, which no index reads: a claim and a renewal rewrite the row on
//! its page without index entries. A job's `state` is `running` while a worker holds its lease,
//! else its state in the queue (`queue_state`, which the indexes read).

mod attempts;
mod budget;
pub mod callbacks;
mod claims;
mod decide;
mod flow;
pub mod kept;
mod leases;
mod marks;
mod model;
mod ops;
mod policy;
mod query;
mod retention;
pub mod simulate;
mod slots;
mod stats;
mod store;
mod subjects;
pub mod trace;
mod worker;
mod worker_tasks;

use std::sync::Arc;

use sqlx::{PgConnection, PgPool};

pub use budget::{Budget, Held, Metered, Through, ThroughOutcome};
pub use callbacks::{CallbackConfig, EventType, NewSubscription, Subscription, SubscriptionError};
pub use claims::Claim;
pub use flow::{Flow, FourEyes, Jobs, Registry, StepCtx, StepFuture, Transition};
pub use model::{Actor, Job, JobEvent, JobState, StepOutcome, StepRun};
pub use ops::JobFilter;
pub use policy::RetryPolicy;
pub use query::{LatestEntry, OpenCount, OutputArray};
pub use retention::Pruned;
pub use store::{Enqueued, NewJob};
pub use subjects::{JobStanding, StepOutput};
pub use worker::{WorkerConfig, WorkerStats};

/// The fenced result write, exposed so tests can play a worker that lost its lease.
#[doc(hidden)]
pub mod fencing {
    pub use super::store::{StepWrite, write_results};
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("no flow is registered for job kind {0:?}")]
    UnknownKind(String),
    #[error("job {0} not found")]
    NotFound(i64),
    #[error("job {id} is {state}: it cannot {action}")]
    InvalidState { id: i64, state: JobState, action: &'static str },
    /// The starter of a job tried to approve a step that needs a second person.
    #[error(
        "four eyes: job {id} was started by {starter}; its step {step} must be approved by another token or person"
    )]
    FourEyes { id: i64, step: String, starter: String },
    #[error("unexpected data in the database: {0}")]
    Corrupt(String),
}

/// The engine's handle: cheap to clone, shared by the API and the workers of one process.
#[derive(Clone)]
pub struct Engine {
    pool: PgPool,
    registry: Arc<Registry>,
    /// A few connections of their own for step marks (see [`marks`]), opened on first use.
    marks: Arc<tokio::sync::OnceCell<PgPool>>,
}

impl Engine {
    pub fn new(pool: PgPool, registry: Registry) -> Self {
        Self { pool, registry: Arc::new(registry), marks: Arc::default() }
    }

    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    pub fn registry(&self) -> &Arc<Registry> {
        &self.registry
    }

    /// Creates jobs in one transaction of their own.
    pub async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>, EngineError> {
        let mut tx = self.pool.begin().await?;
        let out = store::enqueue(&mut tx, &self.registry, jobs).await?;
        tx.commit().await?;
        Ok(out)
    }

    /// Creates jobs inside the caller's transaction; they exist once it commits.
    pub async fn enqueue_in(&self, conn: &mut PgConnection, jobs: &[NewJob]) -> Result<Vec<Enqueued>, EngineError> {
        store::enqueue(conn, &self.registry, jobs).await
    }

    pub async fn cancel(&self, id: i64, actor: &Actor, reason: Option<&str>) -> Result<Job, EngineError> {
        ops::cancel(&self.pool, id, actor, reason).await
    }

    pub async fn retry(&self, id: i64, actor: &Actor) -> Result<Job, EngineError> {
        ops::retry(&self.pool, id, actor).await
    }

    pub async fn approve(&self, id: i64, actor: &Actor) -> Result<Job, EngineError> {
        ops::approve(&self.pool, id, actor).await
    }

    pub async fn job(&self, id: i64) -> Result<Job, EngineError> {
        ops::job(&self.pool, id).await
    }

    pub async fn list(&self, filter: &JobFilter) -> Result<Vec<Job>, EngineError> {
        ops::list(&self.pool, filter).await
    }

    pub async fn step_runs(&self, id: i64) -> Result<Vec<StepRun>, EngineError> {
        ops::step_runs(&self.pool, id).await
    }

    pub async fn events(&self, id: i64) -> Result<Vec<JobEvent>, EngineError> {
        ops::events(&self.pool, id).await
    }

    /// The latest succeeded job of any of `kinds`.
    pub async fn latest_succeeded(&self, kinds: &[&str]) -> Result<Option<Job>, EngineError> {
        query::latest_succeeded(&self.pool, kinds).await
    }

    /// For each key, its element of the array `at` from the latest succeeded job that has one.
    pub async fn latest_entries(&self, at: &OutputArray<'_>, keys: &[&str]) -> Result<Vec<LatestEntry>, EngineError> {
        query::latest_entries(&self.pool, at, keys).await
    }

    /// Unfinished jobs of these tenants by tenant, kind and state.
    pub async fn open_counts(&self, tenants: &[&str]) -> Result<Vec<OpenCount>, EngineError> {
        query::open_counts(&self.pool, tenants).await
    }

    /// Per subject of `tenant` (or only `subject`), its latest job of `kinds` not in a state of `skip`.
    pub async fn latest_per_subject(
        &self,
        tenant: &str,
        kinds: &[&str],
        subject: Option<&str>,
        skip: &[JobState],
    ) -> Result<Vec<Job>, EngineError> {
        subjects::latest_per_subject(&self.pool, tenant, kinds, subject, skip).await
    }

    /// Per subject of `tenant` (or only `subject`), the latest output of step `step` of a job of `kinds`.
    pub async fn latest_step_outputs(
        &self,
        tenant: &str,
        kinds: &[&str],
        step: &str,
        subject: Option<&str>,
    ) -> Result<Vec<StepOutput>, EngineError> {
        subjects::latest_step_outputs(&self.pool, tenant, kinds, step, subject).await
    }

    /// Where each of these jobs stands now.
    pub async fn standings(&self, ids: &[i64]) -> Result<Vec<JobStanding>, EngineError> {
        subjects::standings(&self.pool, ids).await
    }

    /// Unfinished jobs by state (states with none left out).
    pub async fn open_by_state(&self) -> Result<Vec<(JobState, i64)>, EngineError> {
        query::open_by_state(&self.pool).await
    }

    /// Dedupe keys held by a job that has started, inside the caller's transaction: key -> job id.
    pub async fn started_holders_in(
        &self,
        conn: &mut PgConnection,
        keys: &[&str],
    ) -> Result<std::collections::HashMap<String, i64>, EngineError> {
        query::started_holders(conn, keys).await
    }

    /// The database's clock.
    pub async fn now(&self) -> Result<time::OffsetDateTime, EngineError> {
        query::now(&self.pool).await
    }

    /// Whether the database answers.
    pub async fn ping(&self) -> Result<(), EngineError> {
        query::ping(&self.pool).await
    }

    /// Runs a worker until `shutdown` is cancelled and its running steps are drained.
    pub async fn run_worker(
        &self,
        cfg: WorkerConfig,
        stats: Arc<WorkerStats>,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<(), EngineError> {
        worker::run(self, cfg, stats, shutdown).await
    }
}

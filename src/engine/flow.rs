//! What the engine runs: flows (ordered steps) and the transitions their steps return.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::{Actor, Engine, EngineError, Enqueued, Job, JobFilter, NewJob, RetryPolicy};

/// What a step's run decides.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    /// The step's effect holds; its output is kept and the next step starts (or the job succeeds).
    Done(Value),
    /// A transient failure: run the step again after the policy's backoff.
    Retry(String),
    /// A transient failure whose server said when to come back (a 429's Retry-After): run the
    /// step again after the policy's backoff, but not sooner than this (capped by the policy's
    /// longest delay).
    RetryNotBefore(String, Duration),
    /// Run the step again after this long (a durable timer). On that run `StepCtx::waited` is true.
    Wait(Duration),
    /// Run the step again every `every` until it returns something else; once `for_at_most` has
    /// passed since the first poll, `StepCtx::poll_expired` is true, and polling again fails the job.
    Poll { every: Duration, for_at_most: Duration },
    /// A permanent failure: the job fails and waits for a human (retry or cancel).
    Fail(String),
    /// Pause until someone approves; then the step runs again with `StepCtx::approved` true.
    NeedsApproval(String),
}

impl Transition {
    /// `Done` with a step's typed output, stored as JSON.
    pub fn done<T: Serialize>(output: &T) -> Self {
        Self::Done(serde_json::to_value(output).expect("a step output is plain data and serializes"))
    }
}

impl NewJob {
    /// A job whose input is the flow's typed input, serialized once.
    pub fn typed<T: Serialize>(kind: &str, subject: &str, input: &T, actor: Actor) -> Self {
        let input = serde_json::to_value(input).expect("a job input is plain data and serializes");
        Self::new(kind, subject, input, actor)
    }
}

/// What a step may do to other jobs: enqueue, cancel, look up. The engine hands it to each step
/// through [`StepCtx::jobs`]; flows never hold the engine.
#[derive(Clone)]
pub struct Jobs(pub(super) Engine);

impl std::fmt::Debug for Jobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Jobs")
    }
}

impl Jobs {
    pub(crate) fn new(engine: Engine) -> Self {
        Self(engine)
    }

    /// Creates jobs in one transaction of their own.
    pub async fn enqueue(&self, jobs: &[NewJob]) -> Result<Vec<Enqueued>, EngineError> {
        self.0.enqueue(jobs).await
    }

    pub async fn cancel(&self, id: i64, actor: &Actor, reason: Option<&str>) -> Result<Job, EngineError> {
        self.0.cancel(id, actor, reason).await
    }

    pub async fn list(&self, filter: &JobFilter) -> Result<Vec<Job>, EngineError> {
        self.0.list(filter).await
    }

    /// Claims `value` in `scope` for `owner` for good (see [`super::claims`]), on behalf of `job`.
    pub async fn claim(&self, scope: &str, value: &str, owner: &str, job: i64) -> Result<super::Claim, EngineError> {
        super::claims::claim(self.0.pool(), scope, value, owner, job).await
    }

    /// Records at once that `job` made the effect named `mark` (see [`super::marks`]).
    pub async fn mark(&self, job: i64, mark: &str) -> Result<(), EngineError> {
        super::marks::mark(self.marks_pool().await, job, mark).await
    }

    /// The marks' own connections, opened on first use (by [`Self::marked`], before the effect,
    /// so that the mark after it does not wait for a connection to open).
    async fn marks_pool(&self) -> &sqlx::PgPool {
        self.0.marks.get_or_init(|| async { super::marks::pool(self.0.pool()) }).await
    }

    /// Whether `job` recorded the effect named `mark`.
    pub async fn marked(&self, job: i64, mark: &str) -> Result<bool, EngineError> {
        super::marks::marked(self.marks_pool().await, job, mark).await
    }

    /// Whether jobs of this kind can be enqueued (declared or runnable in this process).
    pub fn accepts(&self, kind: &str) -> bool {
        self.0.registry().steps(kind).is_some()
    }
}

/// Everything a step may know about its job. Built by the engine for each attempt.
#[derive(Clone, Debug)]
pub struct StepCtx {
    pub job_id: i64,
    /// When the job was created: with `job_id`, names the job beyond one database's lifetime (a
    /// database made anew numbers its jobs from 1 again).
    pub job_created: OffsetDateTime,
    pub kind: String,
    pub subject: String,
    pub input: Value,
    /// Outputs of the steps already done, by step name.
    pub outputs: Map<String, Value>,
    pub step: &'static str,
    pub step_index: usize,
    /// 1 for the first attempt of this step.
    pub attempt: u32,
    pub waited: bool,
    pub poll_deadline: Option<OffsetDateTime>,
    pub approved_by: Option<String>,
    /// Cancelled when the job is cancelled, the lease is lost or the worker shuts down.
    pub cancel: CancellationToken,
    /// Other jobs, for steps that enqueue or cancel; `None` in a simulation (plans, dry runs).
    pub jobs: Option<Jobs>,
}

impl StepCtx {
    /// The job's name for effects outside onramp's database (a Slurm job name, a `Message-ID`):
    /// `job<id>-<created, Unix seconds>`, the same for every attempt, never the same for job 7 of
    /// a database made anew.
    pub fn job_name(&self) -> String {
        format!("job{}-{}", self.job_id, self.job_created.unix_timestamp())
    }

    /// The first attempt of one step outside any job (a simulation, a plan, a test): no job id,
    /// no approval, no handle on other jobs.
    pub fn detached(
        kind: &str,
        subject: &str,
        input: Value,
        outputs: Map<String, Value>,
        step: &'static str,
        step_index: usize,
    ) -> Self {
        StepCtx {
            job_id: 0,
            job_created: OffsetDateTime::now_utc(),
            kind: kind.to_string(),
            subject: subject.to_string(),
            input,
            outputs,
            step,
            step_index,
            attempt: 1,
            waited: false,
            poll_deadline: None,
            approved_by: None,
            cancel: CancellationToken::new(),
            jobs: None,
        }
    }

    /// The job's input as a typed value; a mismatch is a permanent failure of the step.
    pub fn input<T: DeserializeOwned>(&self) -> Result<T, Transition> {
        serde_json::from_value(self.input.clone())
            .map_err(|e| Transition::Fail(format!("job input does not fit {}: {e}", self.kind)))
    }

    /// The output of an earlier step of this job.
    pub fn output(&self, step: &str) -> Option<&Value> {
        self.outputs.get(step)
    }

    /// The output of an earlier step of this job as its type; `None` when the step has no output
    /// yet or it does not fit.
    pub fn output_of<T: DeserializeOwned>(&self, step: &str) -> Option<T> {
        self.outputs.get(step).and_then(|v| T::deserialize(v).ok())
    }

    /// The engine's handle on other jobs (`None` in a simulation).
    pub fn jobs(&self) -> Option<&Jobs> {
        self.jobs.as_ref()
    }

    pub fn approved(&self) -> bool {
        self.approved_by.is_some()
    }

    pub fn poll_expired(&self) -> bool {
        self.poll_deadline.is_some_and(|d| d <= OffsetDateTime::now_utc())
    }
}

pub type StepFuture<'a> = Pin<Box<dyn Future<Output = Transition> + Send + 'a>>;

/// A kind of job: a fixed, ordered list of steps. Implementations are plain enums of steps;
/// the engine stores which step a job is at and calls `run` for it.
pub trait Flow: Send + Sync + 'static {
    fn kind(&self) -> &'static str;
    fn steps(&self) -> &'static [&'static str];
    fn policy(&self, _step: usize) -> RetryPolicy {
        RetryPolicy::default()
    }
    /// Four eyes: whether an approval this step asks for must come from someone other than the
    /// job's starter (for a step whose approval lets something irreversible happen). The worker
    /// records it with the approval request; the engine refuses the starter's own approval.
    fn four_eyes(&self, _step: usize) -> bool {
        false
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a>;
}

/// A flow every one of whose approvals needs four eyes (e.g. one that releases held work).
pub struct FourEyes<F>(pub F);

impl<F: Flow> Flow for FourEyes<F> {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn steps(&self) -> &'static [&'static str] {
        self.0.steps()
    }
    fn policy(&self, step: usize) -> RetryPolicy {
        self.0.policy(step)
    }
    fn four_eyes(&self, _step: usize) -> bool {
        true
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        self.0.run(step, ctx)
    }
}

/// The kinds a process knows. A *declared* kind (its name and steps) can be enqueued here; a
/// *runnable* one (a [`Flow`]) can also be run by this process's workers. An API-only process
/// declares the kinds its workers elsewhere run.
#[derive(Clone, Default)]
pub struct Registry {
    declared: HashMap<&'static str, &'static [&'static str]>,
    runnable: HashMap<&'static str, Arc<dyn Flow>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// A kind this process accepts jobs of but does not run.
    pub fn declare(mut self, kind: &'static str, steps: &'static [&'static str]) -> Self {
        assert!(!steps.is_empty(), "kind {kind} has no steps");
        self.declared.insert(kind, steps);
        self
    }

    /// A flow this process runs (its kind is declared too).
    pub fn with(mut self, flow: impl Flow) -> Self {
        let steps = flow.steps();
        assert!(!steps.is_empty(), "flow {} has no steps", flow.kind());
        self.declared.insert(flow.kind(), steps);
        self.runnable.insert(flow.kind(), Arc::new(flow));
        self
    }

    /// The flow of a runnable kind.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn Flow>> {
        self.runnable.get(kind)
    }

    /// The steps of a declared (or runnable) kind.
    pub fn steps(&self, kind: &str) -> Option<&'static [&'static str]> {
        self.declared.get(kind).copied()
    }

    /// Every declared kind, sorted.
    pub fn kinds(&self) -> Vec<&'static str> {
        let mut k: Vec<_> = self.declared.keys().copied().collect();
        k.sort_unstable();
        k
    }

    /// The kinds this process's workers run, sorted.
    pub fn runnable_kinds(&self) -> Vec<&'static str> {
        let mut k: Vec<_> = self.runnable.keys().copied().collect();
        k.sort_unstable();
        k
    }
}

//! What the engine runs: flows (ordered steps) and the transitions their steps return.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::RetryPolicy;

/// What a step's run decides.
#[derive(Clone, Debug, PartialEq)]
pub enum Transition {
    /// The step's effect holds; its output is kept and the next step starts (or the job succeeds).
    Done(Value),
    /// A transient failure: run the step again after the policy's backoff.
    Retry(String),
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

/// Everything a step may know about its job. Built by the engine for each attempt.
#[derive(Clone, Debug)]
pub struct StepCtx {
    pub job_id: i64,
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
}

impl StepCtx {
    /// The job's input as a typed value; a mismatch is a permanent failure of the step.
    pub fn input<T: DeserializeOwned>(&self) -> Result<T, Transition> {
        serde_json::from_value(self.input.clone())
            .map_err(|e| Transition::Fail(format!("job input does not fit {}: {e}", self.kind)))
    }

    /// The output of an earlier step of this job.
    pub fn output(&self, step: &str) -> Option<&Value> {
        self.outputs.get(step)
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
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a>;
}

/// The flows a process knows, by kind.
#[derive(Clone, Default)]
pub struct Registry {
    flows: HashMap<&'static str, Arc<dyn Flow>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with(mut self, flow: impl Flow) -> Self {
        let steps = flow.steps();
        assert!(!steps.is_empty(), "flow {} has no steps", flow.kind());
        self.flows.insert(flow.kind(), Arc::new(flow));
        self
    }

    pub fn get(&self, kind: &str) -> Option<&Arc<dyn Flow>> {
        self.flows.get(kind)
    }

    pub fn kinds(&self) -> Vec<&'static str> {
        let mut k: Vec<_> = self.flows.keys().copied().collect();
        k.sort_unstable();
        k
    }
}

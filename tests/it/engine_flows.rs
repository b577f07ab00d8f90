//! Flows for engine tests: each step's behaviour is a closure, and every run is journaled.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onramp::engine::{Flow, RetryPolicy, StepCtx, StepFuture, Transition};

type Script = dyn Fn(usize, StepCtx) -> Pin<Box<dyn Future<Output = Transition> + Send>> + Send + Sync;

#[derive(Clone, Debug)]
pub struct Entry {
    pub job: i64,
    pub step: &'static str,
    pub attempt: u32,
    pub waited: bool,
    pub approved_by: Option<String>,
    pub cancelled: bool,
}

pub struct Scripted {
    kind: &'static str,
    steps: &'static [&'static str],
    policy: RetryPolicy,
    script: Arc<Script>,
    pub journal: Arc<Mutex<Vec<Entry>>>,
}

pub fn fast_policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        initial_delay: Duration::from_millis(200),
        max_delay: Duration::from_secs(2),
        factor: 2.0,
        timeout: Duration::from_secs(30),
    }
}

impl Scripted {
    pub fn new<F, Fut>(kind: &'static str, steps: &'static [&'static str], f: F) -> (Self, Arc<Mutex<Vec<Entry>>>)
    where
        F: Fn(usize, StepCtx) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Transition> + Send + 'static,
    {
        let journal = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(move |i, ctx| Box::pin(f(i, ctx)));
        (Self { kind, steps, policy: fast_policy(), script, journal: journal.clone() }, journal)
    }

    pub fn with_policy(mut self, p: RetryPolicy) -> Self {
        self.policy = p;
        self
    }
}

impl Flow for Scripted {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn steps(&self) -> &'static [&'static str] {
        self.steps
    }
    fn policy(&self, _step: usize) -> RetryPolicy {
        self.policy
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        let journal = self.journal.clone();
        let script = self.script.clone();
        let ctx = ctx.clone();
        Box::pin(async move {
            let entry = Entry {
                job: ctx.job_id,
                step: ctx.step,
                attempt: ctx.attempt,
                waited: ctx.waited,
                approved_by: ctx.approved_by.clone(),
                cancelled: false,
            };
            let cancel = ctx.cancel.clone();
            let idx = journal.lock().unwrap().len();
            journal.lock().unwrap().push(entry);
            let t = script(step, ctx).await;
            journal.lock().unwrap()[idx].cancelled = cancel.is_cancelled();
            t
        })
    }
}

pub fn count(journal: &Arc<Mutex<Vec<Entry>>>, job: i64, step: &str) -> usize {
    journal.lock().unwrap().iter().filter(|e| e.job == job && e.step == step).count()
}

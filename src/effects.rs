//! Effects: the commands and requests a backend makes, as one neutral record that the backends'
//! recording wrappers write, the engine keeps with each step attempt (`step_runs.effects`) and a
//! dry run lists as a plan.
//!
//! The effects of a step attempt: whatever the step's backends report while it runs (their
//! commands and requests) is collected for the attempt and stored with it (`step_runs.effects`).
//! The engine only carries the values; what they say is the backends' business.

use std::cell::RefCell;
use std::future::Future;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use serde_json::Value;

tokio::task_local! {
    static EFFECTS: RefCell<Vec<Value>>;
}

/// Adds one effect to the running attempt's record; does nothing outside an attempt.
pub fn record(effect: Value) {
    let _ = EFFECTS.try_with(|e| e.borrow_mut().push(effect));
}

/// Runs `fut` collecting what it records.
pub async fn collect<T>(fut: impl Future<Output = T>) -> (T, Vec<Value>) {
    EFFECTS
        .scope(RefCell::new(vec![]), async move {
            let out = fut.await;
            (out, EFFECTS.with(|e| e.take()))
        })
        .await
}

/// One outermost call a backend made (or, in a plan, would make).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Effect {
    /// Where: `slurm`, `login/<tenant>`, `storage`, `kubernetes`, `authentik`, `notify`.
    pub system: String,
    /// The command as a person would paste it, or the request (`PATCH …`).
    pub call: String,
    /// Whether it changes anything (reads are recorded too, marked `false`).
    pub write: bool,
}

impl std::fmt::Display for Effect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:<7} {:<16} {}", if self.write { "change" } else { "read" }, self.system, self.call)
    }
}

/// Where recorders append; cheap to clone (shared). Every effect also goes to the running step
/// attempt's record (`crate::effects`), which `onramp serve` keeps with the attempt.
#[derive(Clone)]
pub struct EffectLog(Option<Arc<Mutex<Vec<Effect>>>>);

impl Default for EffectLog {
    /// Keeps every effect (plans, dev, tests).
    fn default() -> Self {
        Self(Some(Arc::default()))
    }
}

impl EffectLog {
    /// Keeps nothing itself: effects go to the step attempts' records only (`onramp serve`).
    pub fn attempts_only() -> Self {
        Self(None)
    }

    pub fn push(&self, system: &str, call: String, write: bool) {
        let e = Effect { system: system.to_string(), call, write };
        record(serde_json::to_value(&e).unwrap_or_default());
        if let Some(log) = &self.0 {
            log.lock().expect("effect log").push(e);
        }
    }
    pub fn len(&self) -> usize {
        self.0.as_ref().map_or(0, |l| l.lock().expect("effect log").len())
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Everything recorded from position `from` on.
    pub fn since(&self, from: usize) -> Vec<Effect> {
        self.0.as_ref().map_or(vec![], |l| l.lock().expect("effect log")[from..].to_vec())
    }
    pub fn all(&self) -> Vec<Effect> {
        self.since(0)
    }
    /// The changes only, in order (what a plan and a real run must agree on).
    pub fn writes(&self) -> Vec<Effect> {
        self.all().into_iter().filter(|e| e.write).collect()
    }
}

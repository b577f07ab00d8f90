//! The effects of a step attempt: whatever the step's backends report while it runs (their
//! commands and requests) is collected for the attempt and stored with it (`step_runs.effects`).
//! The engine only carries the values; what they say is the backends' business.

use std::cell::RefCell;
use std::future::Future;

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

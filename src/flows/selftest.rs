//! `selftest`: a flow with no external effects, for checking a deployment's engine end to end
//! (and for the engine's process-level tests). Its input says how it should behave:
//! `{"sleep_ms": 0, "wait_ms": 0, "fail_attempts": 0, "block_attempts": 0, "approval": false}`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::json;

use crate::engine::{Flow, RetryPolicy, StepCtx, StepFuture, Transition};

pub const KIND: &str = "selftest";

crate::flows::steps! {
    pub enum Step {
        Prepare = "prepare",
        Work = "work",
        Finish = "finish",
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Input {
    /// `work` sleeps this long.
    sleep_ms: u64,
    /// `work` first waits this long on a durable timer.
    wait_ms: u64,
    /// The first attempts of `work` fail with a retryable error.
    fail_attempts: u32,
    /// The first attempts of `work` never finish by themselves (until cancelled or the process dies).
    block_attempts: u32,
    /// `finish` needs approval.
    approval: bool,
}

pub struct SelfTest;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Flow for SelfTest {
    fn kind(&self) -> &'static str {
        KIND
    }

    fn steps(&self) -> &'static [&'static str] {
        Step::NAMES
    }

    fn policy(&self, _step: usize) -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            initial_delay: Duration::from_millis(200),
            max_delay: Duration::from_secs(5),
            factor: 2.0,
            timeout: Duration::from_secs(3600),
        }
    }

    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let input: Input = match ctx.input() {
                Ok(i) => i,
                Err(t) => return t,
            };
            match Step::ALL[step] {
                Step::Prepare => Transition::Done(json!({ "pid": std::process::id() })),
                Step::Work => {
                    if input.wait_ms > 0 && !ctx.waited {
                        return Transition::Wait(Duration::from_millis(input.wait_ms));
                    }
                    if ctx.attempt <= input.fail_attempts {
                        return Transition::Retry(format!("selftest: injected failure {}", ctx.attempt));
                    }
                    let started_ms = now_ms();
                    if ctx.attempt <= input.block_attempts {
                        std::future::pending::<()>().await;
                    }
                    tokio::time::sleep(Duration::from_millis(input.sleep_ms)).await;
                    Transition::Done(json!({
                        "pid": std::process::id(),
                        "started_ms": started_ms,
                        "ended_ms": now_ms(),
                    }))
                }
                Step::Finish if input.approval && !ctx.approved() => {
                    Transition::NeedsApproval("selftest: asked for approval".into())
                }
                Step::Finish => Transition::Done(json!({ "approved_by": ctx.approved_by })),
            }
        })
    }
}

//! Running a flow's steps in order, in this process, with no store: for plans and dry runs. A
//! wait or poll passes at once (reported as what it would be), an approval is taken as given,
//! a retry runs the step again (up to three attempts). Knows nothing of any particular flow.

use serde_json::{Map, Value};
use time::OffsetDateTime;

use super::{Flow, StepCtx, Transition};

/// The most runs of one step in a simulation (a wait, then done; or a few retries).
const MAX_RUNS: u32 = 6;

/// Runs `flow` from its first step until it finishes or a step fails, calling `observe` after
/// each run of a step. Returns the steps' outputs, or the failure.
pub async fn simulate(
    flow: &dyn Flow,
    subject: &str,
    input: Value,
    mut observe: impl FnMut(usize, &'static str, &Transition),
) -> Result<Map<String, Value>, String> {
    let mut outputs = Map::new();
    for (index, &step) in flow.steps().iter().enumerate() {
        let mut ctx = StepCtx::detached(flow.kind(), subject, input.clone(), outputs.clone(), step, index);
        let mut runs = 0;
        loop {
            runs += 1;
            let t = flow.run(index, &ctx).await;
            observe(index, step, &t);
            match t {
                Transition::Done(v) => {
                    outputs.insert(step.to_string(), v);
                    break;
                }
                Transition::Fail(why) => return Err(format!("step {step}: {why}")),
                _ if runs >= MAX_RUNS => return Err(format!("step {step} did not finish in {MAX_RUNS} runs")),
                Transition::Retry(_) | Transition::RetryNotBefore(..) => ctx.attempt += 1,
                Transition::Wait(_) => ctx.waited = true,
                Transition::Poll { .. } => {
                    ctx.waited = true;
                    ctx.poll_deadline = Some(OffsetDateTime::now_utc());
                }
                Transition::NeedsApproval(_) => ctx.approved_by = Some("plan".into()),
            }
        }
    }
    Ok(outputs)
}

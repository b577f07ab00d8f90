//! `reconcile.hold`: the one job (subject `reconcile/hold`) that waits for a person's approval of
//! every offboarding the safety brake holds, from any tenant and either reconcile path; later
//! passes add to its held set rather than making another. Approved, it re-reads both sides and
//! offboards those held users who are still to be offboarded (approving days later after an
//! outage ended offboards nobody), then forgets the held set it read.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::brake::{self, HeldOffboard};
use super::enqueue::{jobs, policy, retry_or_give_up};
use super::plan::OFFBOARD_BUDGET;
use super::tenants::{Pass, reconcile_tenants};
use super::{RECONCILE_HOLD, Reconciler};
use crate::domain::names::{SlurmAccount, Username};
use crate::engine::{Actor, Flow, NewJob, RetryPolicy, StepCtx, StepFuture, Transition};
use crate::flows::{StepResult, finish};

crate::flows::steps! {
    /// The steps, in order.
    pub enum Step {
        AwaitApproval = "await_approval",
        Release = "release",
    }
}

/// The hold's input: why it was first asked for. The held set itself is kept by the engine under
/// the offboarding budget, so that later passes add to it. `tenant` and `held` are what holds
/// made before there was one global hold carried; they are released too.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct HoldInput {
    #[serde(default)]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<HeldPair>,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct HeldPair {
    pub account: SlurmAccount,
    pub username: Username,
}

/// The one hold job: while it is unfinished, enqueueing it again answers it.
pub fn hold_job(reason: &str) -> NewJob {
    let input = HoldInput { reason: reason.into(), ..Default::default() };
    NewJob::typed(RECONCILE_HOLD, "reconcile/hold", &input, Actor::reconciler()).dedupe(RECONCILE_HOLD)
}

pub struct ReconcileHold(pub Arc<Reconciler>);

impl Flow for ReconcileHold {
    fn kind(&self) -> &'static str {
        RECONCILE_HOLD
    }
    fn steps(&self) -> &'static [&'static str] {
        Step::NAMES
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        policy()
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move { finish(self.step(Step::ALL[step], ctx).await) })
    }
}

impl ReconcileHold {
    async fn step(&self, step: Step, ctx: &StepCtx) -> StepResult {
        let input: HoldInput = ctx.input()?;
        let queue = jobs(ctx).map_err(Transition::Fail)?;
        let (mut held, ids) = brake::held(queue).await.map_err(|e| retry_or_give_up(ctx, e))?;
        if let Some(tenant) = &input.tenant {
            held.extend(input.held.iter().map(|h| HeldOffboard {
                tenant: tenant.clone(),
                account: h.account.clone(),
                username: h.username.clone(),
                reason: input.reason.clone(),
            }));
        }
        match step {
            Step::AwaitApproval => Ok(if ctx.approved() {
                Transition::Done(json!({ "approved_by": ctx.approved_by }))
            } else {
                // later passes add to the held set: each reconcile report lists its tenants' (`held`)
                Transition::NeedsApproval(format!(
                    "{} (held so far: {} offboarding(s); later passes add theirs, listed as `held` in their reports \
                     and in /v1/tenants; approving offboards those of them still to be offboarded)",
                    input.reason,
                    held.len()
                ))
            }),
            Step::Release => {
                let names: Vec<String> =
                    held.iter().map(|h| h.tenant.clone()).collect::<BTreeSet<_>>().into_iter().collect();
                let only: Vec<(SlurmAccount, Username)> =
                    held.iter().map(|h| (h.account.clone(), h.username.clone())).collect();
                let cause = format!("approved hold job {}", ctx.job_id);
                let mut report = if names.is_empty() {
                    json!({ "tenants": [] })
                } else {
                    let pass = Pass { names: Some(&names), cause: &cause, release: true, only: Some(&only) };
                    reconcile_tenants(&self.0, ctx, pass).await.map_err(|e| retry_or_give_up(ctx, e))?
                };
                // what the pass did not offboard again is no longer to be offboarded
                queue.forget_held(OFFBOARD_BUDGET, &ids).await.map_err(|e| retry_or_give_up(ctx, e))?;
                report["released"] =
                    json!(held.iter().map(|h| format!("{}/{}", h.account, h.username)).collect::<Vec<_>>());
                Ok(Transition::Done(report))
            }
        }
    }
}

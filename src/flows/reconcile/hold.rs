//! `reconcile.hold`: waits for approval, then re-reads both sides and offboards those held users
//! who are still to be offboarded (approving days later after an outage ended offboards nobody).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::enqueue::{policy, retry_or_give_up};
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

/// The hold's input: the tenant, the offboardings the brake held, and why.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct HoldInput {
    pub tenant: String,
    pub held: Vec<HeldPair>,
    pub reason: String,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct HeldPair {
    pub account: SlurmAccount,
    pub username: Username,
}

impl HoldInput {
    /// The hold job of this input: one unfinished hold per tenant.
    pub fn job(&self) -> NewJob {
        NewJob::typed(RECONCILE_HOLD, &format!("reconcile/hold/{}", self.tenant), self, Actor::reconciler())
            .dedupe(format!("{RECONCILE_HOLD}:{}", self.tenant))
    }
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
        match step {
            Step::AwaitApproval => Ok(if ctx.approved() {
                Transition::Done(json!({ "approved_by": ctx.approved_by }))
            } else {
                Transition::NeedsApproval(format!("{} (held: {})", input.reason, input.held.len()))
            }),
            Step::Release => {
                let only: Vec<(SlurmAccount, Username)> =
                    input.held.into_iter().map(|h| (h.account, h.username)).collect();
                let cause = format!("approved hold job {}", ctx.job_id);
                let names = [input.tenant];
                let pass = Pass { names: Some(&names), cause: &cause, brake: None, only: Some(&only) };
                let report = reconcile_tenants(&self.0, ctx, pass).await.map_err(|e| retry_or_give_up(ctx, e))?;
                Ok(Transition::Done(report))
            }
        }
    }
}

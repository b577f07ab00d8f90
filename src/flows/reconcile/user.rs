//! `reconcile.user`: read the user from Authentik and the associations from the cluster, then
//! onboard, offboard or nothing; a re-added member's open offboarding is superseded.

use std::sync::Arc;

use serde_json::json;

use super::brake::{self, Mode, managed_users};
use super::enqueue::{enqueue, jobs, policy, retry_or_give_up, supersede};
use super::{RECONCILE_STEPS, RECONCILE_USER, Reconciler, UserInput, full_job, plan};
use crate::backends::authentik::{AuthentikError, User};
use crate::domain::names::{SlurmAccount, Username};
use crate::engine::{Actor, Flow, JobFilter, Jobs, RetryPolicy, StepCtx, StepFuture, Transition};
use crate::flows::user_offboard::USER_OFFBOARD;
use crate::flows::{StepResult, finish};

pub struct ReconcileUser(pub Arc<Reconciler>);

impl Flow for ReconcileUser {
    fn kind(&self) -> &'static str {
        RECONCILE_USER
    }
    fn steps(&self) -> &'static [&'static str] {
        RECONCILE_STEPS
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        policy()
    }
    fn run<'a>(&'a self, _: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move { finish(reconcile(&self.0, ctx).await) })
    }
}

async fn reconcile(r: &Reconciler, ctx: &StepCtx) -> StepResult {
    let input: UserInput = ctx.input()?;
    let found = match (input.pk, input.username.as_deref()) {
        (Some(pk), _) => r.authentik.user(pk).await,
        (None, Some(name)) => r.authentik.user_by_username(name).await,
        (None, None) => return Ok(Transition::Fail("reconcile.user needs pk or username".into())),
    };
    let user = match found {
        Ok(u) if !u.knows_group_names() => {
            let why = format!("Authentik's answer for user {} lacks groups_obj", u.pk);
            return Err(retry_or_give_up(ctx, why));
        }
        Ok(u) => Some(u),
        Err(AuthentikError::NotFound(_)) => None,
        Err(e) => return Err(retry_or_give_up(ctx, e)),
    };
    let queue = jobs(ctx).map_err(Transition::Fail)?;
    let name = user.as_ref().map(|u| u.username.clone()).or(input.username.clone());
    let Some(name) = name else {
        // Only a pk, and Authentik no longer knows it: which cluster user it was is only
        // answerable by looking at everything.
        let cause = format!("user pk {} missing in Authentik", input.pk.unwrap_or_default());
        let e = queue.enqueue(&[full_job(Actor::reconciler(), &cause)]).await.map_err(|e| retry_or_give_up(ctx, e))?;
        return Ok(Transition::Done(json!({ "decision": "full_reconcile", "job": e[0].id,
            "reason": format!("{cause} (deleted?): a full reconcile finds its associations") })));
    };
    let username = match Username::parse(&name) {
        Ok(u) => u,
        Err(e) => return Ok(Transition::Done(json!({ "decision": "ignored", "reason": e.to_string() }))),
    };
    let accounts = r.tenants.all_accounts();
    let (actual, drifted) = r.actual_with_limits(&accounts).await.map_err(|e| retry_or_give_up(ctx, e))?;
    let (mut actions, reason) = plan::plan_user(&r.tenants, user.as_ref(), &username, &actual, &drifted);
    let restored = restore_readded(r, queue, user.as_ref(), &username, &actual, &mut actions)
        .await
        .map_err(|e| retry_or_give_up(ctx, e))?;
    let decision = match actions.iter().map(|a| a.op).collect::<Vec<_>>().as_slice() {
        [] => "nothing",
        ops if ops.iter().all(|o| *o == plan::Op::Onboard) => "onboard",
        ops if ops.iter().all(|o| *o == plan::Op::Offboard) => "offboard",
        _ => "onboard_and_offboard",
    };
    let (offboard, onboard): (Vec<plan::Action>, Vec<plan::Action>) =
        actions.into_iter().partition(|a| a.op == plan::Op::Offboard);
    let mut jobs = enqueue(queue, &onboard, &input.cause).await.map_err(|e| retry_or_give_up(ctx, e))?;
    // the same brake as a tenant pass: a budget shared by every path, tenant and replica
    let off = brake::offboard(r, queue, Mode::Metered, managed_users(&actual), &offboard, None, &input.cause)
        .await
        .map_err(|e| retry_or_give_up(ctx, e))?;
    jobs.extend(off.jobs);
    Ok(Transition::Done(json!({ "decision": decision, "username": username, "reason": reason, "jobs": jobs,
                                "held": off.held, "hold_job": off.hold_job, "brake": off.reason,
                                "cancelled_offboardings": restored })))
}

/// A user who is an active member again while an offboarding of theirs is still open (blocked,
/// in its retention period): the offboarding is cancelled and an onboarding enqueued instead
/// (it converges the association and lifts the block). Returns the cancelled job ids.
async fn restore_readded(
    r: &Reconciler,
    queue: &Jobs,
    user: Option<&User>,
    username: &Username,
    actual: &[(SlurmAccount, Username)],
    actions: &mut Vec<plan::Action>,
) -> Result<Vec<i64>, String> {
    let Some(u) = user.filter(|u| u.is_active) else {
        return Ok(vec![]);
    };
    let Ok(m) = plan::member(&r.tenants, u) else {
        return Ok(vec![]);
    };
    let mut cancelled = vec![];
    for (tenant, account) in r.tenants.placements(&u.group_names()) {
        if !actual.contains(&(account.clone(), username.clone())) {
            continue; // no association: the plan onboards them anyway
        }
        let filter = JobFilter {
            kind: Some(USER_OFFBOARD.into()),
            subject: Some(format!("{tenant}/{username}")),
            limit: 20,
            ..Default::default()
        };
        let open: Vec<i64> = queue
            .list(&filter)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|j| !matches!(j.state.as_str(), "succeeded" | "cancelled"))
            .map(|j| j.id)
            .collect();
        if !open.is_empty() {
            cancelled.extend(supersede(queue, &open, &tenant, &account, &m, actions).await);
        }
    }
    Ok(cancelled)
}

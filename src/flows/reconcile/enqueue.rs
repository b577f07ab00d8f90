//! What the reconcile flows share: their retry policy, the jobs an action calls for, enqueueing
//! them, and cancelling an offboarding a re-added member supersedes.

use std::time::Duration;

use serde_json::{Value, json};

use super::plan::{Action, Member, Op};
use crate::domain::names::{SlurmAccount, TenantName};
use crate::engine::{Actor, Jobs, NewJob, RetryPolicy, StepCtx, Transition};
use crate::flows::user_offboard::{self, USER_OFFBOARD};
use crate::flows::user_onboard::{self, USER_ONBOARD};

pub(super) fn policy() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 8,
        initial_delay: Duration::from_secs(2),
        max_delay: Duration::from_secs(300),
        factor: 3.0,
        timeout: Duration::from_secs(600),
    }
}

/// A transient failure: retry, or on the last attempt finish with the reason (a failed reconcile
/// job would hold its subject; the next periodic pass tries again anyway).
pub(super) fn retry_or_give_up(ctx: &StepCtx, why: impl ToString) -> Transition {
    let why = why.to_string();
    if ctx.attempt >= policy().max_attempts {
        Transition::Done(json!({ "decision": "gave_up", "reason": why }))
    } else {
        Transition::Retry(why)
    }
}

/// The engine's handle on other jobs; a simulation has none.
pub(super) fn jobs(ctx: &StepCtx) -> Result<&Jobs, String> {
    ctx.jobs().ok_or_else(|| "this run has no job queue (a simulation)".to_string())
}

/// The onboarding or offboarding job for an action.
pub fn job_for(a: &Action, cause: &str) -> NewJob {
    let (tenant, account, username) = (a.tenant.to_string(), a.account.to_string(), a.username.to_string());
    let (reason, cause) = (a.reason.clone(), cause.to_string());
    match a.op {
        Op::Onboard => user_onboard::Input {
            tenant,
            account,
            username,
            pk: a.member.as_ref().map(|m| m.pk),
            uid_number: a.member.as_ref().map(|m| m.uid_number),
            gid_number: a.member.as_ref().map(|m| m.gid_number),
            reason,
            cause,
        }
        .job(Actor::reconciler()),
        Op::Offboard => user_offboard::Input { tenant, account, username, hard_cutoff: false, reason, cause }
            .job(Actor::reconciler()),
    }
}

/// Enqueues the actions' jobs; returns what became of each.
pub(super) async fn enqueue(queue: &Jobs, actions: &[Action], cause: &str) -> Result<Vec<Value>, String> {
    let (known, unknown): (Vec<&Action>, Vec<&Action>) =
        actions.iter().partition(|a| queue.accepts(if a.op == Op::Onboard { USER_ONBOARD } else { USER_OFFBOARD }));
    let jobs: Vec<NewJob> = known.iter().map(|a| job_for(a, cause)).collect();
    let done = queue.enqueue(&jobs).await.map_err(|e| e.to_string())?;
    let mut out: Vec<Value> = known
        .iter()
        .zip(&done)
        .map(|(a, e)| json!({ "op": a.op, "account": a.account, "username": a.username, "reason": a.reason, "job": e.id, "new": e.created }))
        .collect();
    for a in unknown {
        tracing::warn!(op = ?a.op, user = %a.username, "no flow for this job kind in this build: not enqueued");
        out.push(json!({ "op": a.op, "account": a.account, "username": a.username, "reason": a.reason, "job": null,
                         "note": "not enqueued: this build has no flow for the job kind" }));
    }
    Ok(out)
}

/// Cancels the offboardings `open` of a member who is back under `account`, and adds the
/// onboarding that restores them (unless `actions` has it). Returns the cancelled ids.
pub(super) async fn supersede(
    queue: &Jobs,
    open: &[i64],
    tenant: &TenantName,
    account: &SlurmAccount,
    m: &Member,
    actions: &mut Vec<Action>,
) -> Vec<i64> {
    let mut cancelled = vec![];
    for &id in open {
        let why = "the user is an active member again: restored instead of offboarded";
        match queue.cancel(id, &Actor::reconciler(), Some(why)).await {
            Ok(_) => cancelled.push(id),
            Err(e) => tracing::warn!(job = id, error = %e, "could not cancel a superseded offboarding"),
        }
    }
    if !actions.iter().any(|a| a.op == Op::Onboard && &a.account == account && a.username == m.username) {
        actions.push(Action {
            op: Op::Onboard,
            tenant: tenant.clone(),
            account: account.clone(),
            username: m.username.clone(),
            member: Some(m.clone()),
            reason: format!("re-added while offboarding under {account}: restore"),
        });
    }
    cancelled
}

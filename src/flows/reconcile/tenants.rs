//! `reconcile.tenant` and `reconcile.full`: every member of the tenants' groups against every
//! association under their accounts (one bulk cluster read), with the safety brake. A released
//! hold (`reconcile.hold`) runs the same pass without the brake, limited to the held users.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::enqueue::{enqueue, jobs, policy, retry_or_give_up, supersede};
use super::hold::{HeldPair, HoldInput};
use super::plan::{self, Action};
use super::{RECONCILE_FULL, RECONCILE_STEPS, RECONCILE_TENANT, Reconciler, TenantsInput};
use crate::backends::authentik::{AuthentikError, User};
use crate::domain::names::{SlurmAccount, Username};
use crate::domain::tenants::Tenant;
use crate::engine::{Flow, JobFilter, JobState, Jobs, RetryPolicy, StepCtx, StepFuture, Transition};
use crate::flows::user_offboard::{self, USER_OFFBOARD};
use crate::flows::{StepResult, finish};

pub struct ReconcileTenants {
    pub reconciler: Arc<Reconciler>,
    pub full: bool,
}

impl Flow for ReconcileTenants {
    fn kind(&self) -> &'static str {
        if self.full { RECONCILE_FULL } else { RECONCILE_TENANT }
    }
    fn steps(&self) -> &'static [&'static str] {
        RECONCILE_STEPS
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        policy()
    }
    fn run<'a>(&'a self, _: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move { finish(self.reconcile(ctx).await) })
    }
}

impl ReconcileTenants {
    async fn reconcile(&self, ctx: &StepCtx) -> StepResult {
        let input: TenantsInput = ctx.input()?;
        let r = &self.reconciler;
        let names = if self.full { None } else { input.tenants.clone() };
        let pass = Pass { names: names.as_deref(), cause: &input.cause, brake: Some(r.brake), only: None };
        let report = reconcile_tenants(r, ctx, pass).await.map_err(|e| retry_or_give_up(ctx, e))?;
        Ok(Transition::Done(report))
    }
}

/// One pass over some tenants (all when `names` is None). With `only`, offboardings are limited
/// to those (account, user) pairs (a released hold).
pub(super) struct Pass<'a> {
    pub names: Option<&'a [String]>,
    pub cause: &'a str,
    pub brake: Option<plan::Brake>,
    pub only: Option<&'a [(SlurmAccount, Username)]>,
}

/// Plans and enqueues for the pass's tenants; the report is the step's output.
pub(super) async fn reconcile_tenants(r: &Reconciler, ctx: &StepCtx, pass: Pass<'_>) -> Result<Value, String> {
    let queue = jobs(ctx)?;
    let tenants: Vec<_> = r
        .tenants
        .tenants
        .iter()
        .filter(|t| pass.names.is_none_or(|n| n.iter().any(|x| x == t.name.as_str())))
        .collect();
    let mut report = vec![];
    let mut ready = vec![];
    for t in tenants {
        let mut members = BTreeMap::new();
        let mut missing = None;
        for g in t.groups() {
            match r.authentik.active_members(g).await {
                Ok(list) => {
                    members.insert(g.to_string(), list);
                }
                Err(AuthentikError::NotFound(what)) => {
                    missing = Some(what);
                    break;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        match missing {
            Some(what) => report.push(json!({ "tenant": t.name, "decision": "skipped",
                "reason": format!("Authentik has no {what}: nobody is onboarded or offboarded on a missing group") })),
            None => ready.push((t, members)),
        }
    }
    let accounts: Vec<SlurmAccount> = ready.iter().flat_map(|(t, _)| t.accounts()).collect();
    let actual = r.actual(&accounts).await?;
    for (t, members) in ready {
        let counts = member_counts(t, &members, &actual);
        let mut p = plan::plan_tenant(&r.tenants, t, &members, &actual, pass.brake);
        if let Some(only) = pass.only {
            p.offboard.retain(|a| only.contains(&(a.account.clone(), a.username.clone())));
        }
        let mut actions = p.onboard.clone();
        actions.extend(p.offboard.iter().cloned());
        let restored = restore_in_tenant(r, queue, t, &members, &mut actions).await?;
        let jobs = enqueue(queue, &actions, pass.cause).await?;
        let mut hold = Value::Null;
        if let Some(reason) = &p.brake_reason {
            tracing::warn!(tenant = %t.name, "{reason}");
            let held =
                p.held.iter().map(|a| HeldPair { account: a.account.clone(), username: a.username.clone() }).collect();
            let input = HoldInput { tenant: t.name.to_string(), held, reason: reason.clone() };
            hold = json!(queue.enqueue(&[input.job()]).await.map_err(|e| e.to_string())?[0].id);
        }
        report.push(json!({
            "tenant": t.name,
            "decision": if p.brake_reason.is_some() { "held" } else if actions.is_empty() { "nothing" } else { "changes" },
            "unchanged": p.unchanged,
            "jobs": jobs,
            "held": p.held.iter().map(|a| format!("{}/{}", a.account, a.username)).collect::<Vec<_>>(),
            "hold_job": hold,
            "reason": p.brake_reason,
            "skipped": p.skipped,
            "cancelled_offboardings": restored,
            "members": counts,
        }));
    }
    Ok(json!({ "tenants": report }))
}

/// The tenant-wide form of `user::restore_readded`: the open offboardings of the tenant whose
/// user is an active member placed under the same account again are cancelled, and an onboarding
/// (which lifts the block) is added to `actions`. Returns the cancelled job ids.
async fn restore_in_tenant(
    r: &Reconciler,
    queue: &Jobs,
    t: &Tenant,
    members: &BTreeMap<String, Vec<User>>,
    actions: &mut Vec<Action>,
) -> Result<Vec<i64>, String> {
    let mut open = vec![];
    for state in [JobState::Pending, JobState::Running, JobState::Waiting, JobState::NeedsApproval, JobState::Failed] {
        let f = JobFilter {
            state: Some(state),
            kind: Some(USER_OFFBOARD.into()),
            subject: Some(format!("{}/", t.name)),
            limit: 1000,
            ..Default::default()
        };
        open.extend(queue.list(&f).await.map_err(|e| e.to_string())?);
    }
    if open.is_empty() {
        return Ok(vec![]);
    }
    // each open offboarding with the account its input names
    let open: Vec<(i64, String, Option<String>)> = open
        .into_iter()
        .map(|j| {
            let account = serde_json::from_value::<user_offboard::Input>(j.input).ok().map(|i| i.account);
            (j.id, j.subject, account)
        })
        .collect();
    let mut cancelled = vec![];
    for (u, groups) in plan::groups_by_user(members).values().filter(|(u, _)| u.is_active) {
        let Ok(m) = plan::member(&r.tenants, u) else { continue };
        for account in t.placement(groups) {
            let subject = format!("{}/{}", t.name, m.username);
            let superseded: Vec<i64> = open
                .iter()
                .filter(|(_, s, a)| *s == subject && a.as_deref() == Some(account.as_str()))
                .map(|(id, _, _)| *id)
                .collect();
            if !superseded.is_empty() {
                cancelled.extend(supersede(queue, &superseded, &t.name, &account, &m, actions).await);
            }
        }
    }
    Ok(cancelled)
}

/// What was measured of a tenant: active members of each of its groups (`members`: of the tenant
/// group) and the Slurm user associations under its accounts.
fn member_counts(t: &Tenant, members: &BTreeMap<String, Vec<User>>, actual: &[(SlurmAccount, Username)]) -> Value {
    let accounts = t.accounts();
    let mut by_account: BTreeMap<&str, usize> = accounts.iter().map(|a| (a.as_str(), 0)).collect();
    let mut users = BTreeSet::new();
    for (a, u) in actual.iter().filter(|(a, _)| accounts.contains(a)) {
        *by_account.entry(a.as_str()).or_default() += 1;
        users.insert(u);
    }
    let groups: BTreeMap<&str, usize> = members.iter().map(|(g, l)| (g.as_str(), l.len())).collect();
    json!({
        "members": members.get(&t.group).map_or(0, Vec::len),
        "groups": groups,
        "associations": by_account.values().sum::<usize>(),
        "slurm_users": users.len(),
        "by_account": by_account,
    })
}

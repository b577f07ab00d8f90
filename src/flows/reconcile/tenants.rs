//! `reconcile.tenant` and `reconcile.full`: every member of the tenants' groups against every
//! association under their accounts (one bulk cluster read), with the safety brake. A released
//! hold (`reconcile.hold`) runs the same pass past the brake, limited to the held users.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use super::brake::{self, Mode, managed_users};
use super::enqueue::{enqueue, jobs, policy, retry_or_give_up, supersede};
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
        let pass = Pass { names: names.as_deref(), cause: &input.cause, release: false, only: None };
        let report = reconcile_tenants(r, ctx, pass).await.map_err(|e| retry_or_give_up(ctx, e))?;
        Ok(Transition::Done(report))
    }
}

/// One pass over some tenants (all when `names` is None). `release`: a person approved the held
/// offboardings, limited by `only` to those (account, user) pairs; they go past the brake.
pub(super) struct Pass<'a> {
    pub names: Option<&'a [String]>,
    pub cause: &'a str,
    pub release: bool,
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
    // every account: the brake's budget is a share of all managed users
    let (actual, drifted) = r.actual_with_limits(&r.tenants.all_accounts()).await?;
    let managed = managed_users(&actual);
    let (mode, check) = if pass.release { (Mode::Released, None) } else { (Mode::Metered, Some(r.brake)) };
    for (t, members) in ready {
        let counts = member_counts(t, &members, &actual);
        let mut p = plan::plan_tenant(&r.tenants, t, &members, &actual, &drifted, check);
        if let Some(only) = pass.only {
            p.offboard.retain(|a| only.contains(&(a.account.clone(), a.username.clone())));
        }
        let mut actions = p.onboard.clone();
        let restored = restore_in_tenant(r, queue, t, &members, &mut actions).await?;
        let mut jobs = enqueue(queue, &actions, pass.cause).await?;
        let whole = p.brake_reason.as_deref().map(|why| (why, &p.held[..]));
        let off = brake::offboard(r, queue, mode, managed, &p.offboard, whole, pass.cause).await?;
        jobs.extend(off.jobs);
        let reason = p.brake_reason.clone().or(off.reason);
        report.push(json!({
            "tenant": t.name,
            "decision": if !off.held.is_empty() { "held" } else if jobs.is_empty() { "nothing" } else { "changes" },
            "unchanged": p.unchanged,
            "jobs": jobs,
            "held": off.held,
            "hold_job": off.hold_job,
            "reason": reason,
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

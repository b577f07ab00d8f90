//! The reconcile flows: one user, some tenants or all (with the safety brake), and the hold that
//! keeps braked offboardings until a person approves. Each decision and its reason is the step's
//! output, kept in the job's history.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::backends::authentik::AuthentikError;
use crate::domain::names::{SlurmAccount, Username};
use crate::engine::{Actor, Flow, NewJob, RetryPolicy, StepCtx, StepFuture, Transition};
use crate::flows::reconcile::plan::{self, Action, Op};
use crate::flows::reconcile::{
    RECONCILE_FULL, RECONCILE_HOLD, RECONCILE_TENANT, RECONCILE_USER, Reconciler, USER_OFFBOARD, USER_ONBOARD, full_job,
};

fn policy() -> RetryPolicy {
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
fn retry_or_give_up(ctx: &StepCtx, why: String) -> Transition {
    if ctx.attempt >= policy().max_attempts {
        Transition::Done(json!({ "decision": "gave_up", "reason": why }))
    } else {
        Transition::Retry(why)
    }
}

/// The onboarding or offboarding job for an action.
pub fn job_for(a: &Action, cause: &str) -> NewJob {
    let (kind, mut input) = match a.op {
        Op::Onboard => (USER_ONBOARD, json!({})),
        Op::Offboard => (USER_OFFBOARD, json!({})),
    };
    input["tenant"] = json!(a.tenant);
    input["account"] = json!(a.account);
    input["username"] = json!(a.username);
    input["reason"] = json!(a.reason);
    input["cause"] = json!(cause);
    if let Some(m) = &a.member {
        input["pk"] = json!(m.pk);
        input["uid_number"] = json!(m.uid_number);
        input["gid_number"] = json!(m.gid_number);
    }
    NewJob::new(kind, &format!("{}/{}", a.tenant, a.username), input, Actor::reconciler())
        .dedupe(format!("{kind}:{}/{}", a.account, a.username))
}

/// Enqueues the actions' jobs; returns what became of each.
async fn enqueue(r: &Reconciler, actions: &[Action], cause: &str) -> Result<Vec<Value>, String> {
    let Some(engine) = r.engine() else {
        return Err("the reconciler is not attached to an engine".into());
    };
    let (known, unknown): (Vec<&Action>, Vec<&Action>) = actions
        .iter()
        .partition(|a| engine.registry().get(if a.op == Op::Onboard { USER_ONBOARD } else { USER_OFFBOARD }).is_some());
    let jobs: Vec<NewJob> = known.iter().map(|a| job_for(a, cause)).collect();
    let done = engine.enqueue(&jobs).await.map_err(|e| e.to_string())?;
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

#[derive(Debug, Deserialize)]
struct UserInput {
    pk: Option<i64>,
    username: Option<String>,
    #[serde(default)]
    cause: String,
}

/// `reconcile.user`: read the user from Authentik and the associations from the cluster, then
/// onboard, offboard or nothing.
pub struct ReconcileUser(pub Arc<Reconciler>);

impl Flow for ReconcileUser {
    fn kind(&self) -> &'static str {
        RECONCILE_USER
    }
    fn steps(&self) -> &'static [&'static str] {
        &["reconcile"]
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        policy()
    }
    fn run<'a>(&'a self, _: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let input: UserInput = match ctx.input() {
                Ok(i) => i,
                Err(t) => return t,
            };
            let r = &self.0;
            let found = match (input.pk, input.username.as_deref()) {
                (Some(pk), _) => r.authentik.user(pk).await,
                (None, Some(name)) => r.authentik.user_by_username(name).await,
                (None, None) => {
                    return Transition::Fail("reconcile.user needs pk or username".into());
                }
            };
            let user = match found {
                Ok(u) if !u.knows_group_names() => {
                    let why = format!("Authentik's answer for user {} lacks groups_obj", u.pk);
                    return retry_or_give_up(ctx, why);
                }
                Ok(u) => Some(u),
                Err(AuthentikError::NotFound(_)) => None,
                Err(e) => return retry_or_give_up(ctx, e.to_string()),
            };
            let name = user.as_ref().map(|u| u.username.clone()).or(input.username.clone());
            let Some(name) = name else {
                // Only a pk, and Authentik no longer knows it: which cluster user it was is only
                // answerable by looking at everything.
                let Some(engine) = r.engine() else {
                    return Transition::Fail("not attached to an engine".into());
                };
                let cause = format!("user pk {} missing in Authentik", input.pk.unwrap_or_default());
                return match engine.enqueue(&[full_job(Actor::reconciler(), &cause)]).await {
                    Ok(e) => Transition::Done(json!({ "decision": "full_reconcile", "job": e[0].id,
                        "reason": format!("{cause} (deleted?): a full reconcile finds its associations") })),
                    Err(e) => retry_or_give_up(ctx, e.to_string()),
                };
            };
            let username = match Username::parse(&name) {
                Ok(u) => u,
                Err(e) => {
                    return Transition::Done(json!({ "decision": "ignored", "reason": e.to_string() }));
                }
            };
            let accounts = r.tenants.all_accounts();
            let actual = match r.cluster.associations(&accounts).await {
                Ok(a) => a,
                Err(e) => return retry_or_give_up(ctx, e.to_string()),
            };
            let (mut actions, reason) = plan::plan_user(&r.tenants, user.as_ref(), &username, &actual);
            let restored = match restore_readded(r, user.as_ref(), &username, &actual, &mut actions).await {
                Ok(v) => v,
                Err(e) => return retry_or_give_up(ctx, e),
            };
            let decision = match actions.iter().map(|a| a.op).collect::<Vec<_>>().as_slice() {
                [] => "nothing",
                ops if ops.iter().all(|o| *o == Op::Onboard) => "onboard",
                ops if ops.iter().all(|o| *o == Op::Offboard) => "offboard",
                _ => "onboard_and_offboard",
            };
            match enqueue(r, &actions, &input.cause).await {
                Ok(jobs) => Transition::Done(
                    json!({ "decision": decision, "username": username, "reason": reason, "jobs": jobs,
                            "cancelled_offboardings": restored }),
                ),
                Err(e) => retry_or_give_up(ctx, e),
            }
        })
    }
}

/// A user who is an active member again while an offboarding of theirs is still open (blocked,
/// in its retention period): the offboarding is cancelled and an onboarding enqueued instead
/// (it converges the association and lifts the block). Returns the cancelled job ids.
async fn restore_readded(
    r: &Reconciler,
    user: Option<&crate::backends::authentik::User>,
    username: &Username,
    actual: &[(SlurmAccount, Username)],
    actions: &mut Vec<Action>,
) -> Result<Vec<i64>, String> {
    let (Some(u), Some(engine)) = (user.filter(|u| u.is_active), r.engine()) else {
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
        let filter = crate::engine::JobFilter {
            kind: Some(USER_OFFBOARD.into()),
            subject: Some(format!("{tenant}/{username}")),
            limit: 20,
            ..Default::default()
        };
        let open: Vec<i64> = engine
            .list(&filter)
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .filter(|j| !matches!(j.state.as_str(), "succeeded" | "cancelled"))
            .map(|j| j.id)
            .collect();
        if !open.is_empty() {
            cancelled.extend(supersede(engine, &open, &tenant, &account, &m, actions).await);
        }
    }
    Ok(cancelled)
}

/// Cancels the offboardings `open` of a member who is back under `account`, and adds the
/// onboarding that restores them (unless `actions` has it). Returns the cancelled ids.
async fn supersede(
    engine: &crate::engine::Engine,
    open: &[i64],
    tenant: &crate::domain::names::TenantName,
    account: &SlurmAccount,
    m: &plan::Member,
    actions: &mut Vec<Action>,
) -> Vec<i64> {
    let mut cancelled = vec![];
    for &id in open {
        let why = "the user is an active member again: restored instead of offboarded";
        match engine.cancel(id, &Actor::reconciler(), Some(why)).await {
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

/// The tenant-wide form of [`restore_readded`]: the open offboardings of the tenant whose user is
/// an active member placed under the same account again are cancelled, and an onboarding (which
/// lifts the block) is added to `actions`. Returns the cancelled job ids.
async fn restore_in_tenant(
    r: &Reconciler,
    t: &crate::domain::tenants::Tenant,
    members: &BTreeMap<String, Vec<crate::backends::authentik::User>>,
    actions: &mut Vec<Action>,
) -> Result<Vec<i64>, String> {
    use crate::engine::{JobFilter, JobState};
    let Some(engine) = r.engine() else {
        return Ok(vec![]);
    };
    let mut open = vec![];
    for state in [JobState::Pending, JobState::Running, JobState::Waiting, JobState::NeedsApproval, JobState::Failed] {
        let f = JobFilter {
            state: Some(state),
            kind: Some(USER_OFFBOARD.into()),
            subject: Some(format!("{}/", t.name)),
            limit: 1000,
            ..Default::default()
        };
        open.extend(engine.list(&f).await.map_err(|e| e.to_string())?);
    }
    if open.is_empty() {
        return Ok(vec![]);
    }
    let mut cancelled = vec![];
    for (u, groups) in plan::groups_by_user(members).values().filter(|(u, _)| u.is_active) {
        let Ok(m) = plan::member(&r.tenants, u) else { continue };
        for account in t.placement(groups) {
            let subject = format!("{}/{}", t.name, m.username);
            let superseded: Vec<i64> = open
                .iter()
                .filter(|j| j.subject == subject && j.input["account"].as_str() == Some(account.as_str()))
                .map(|j| j.id)
                .collect();
            if !superseded.is_empty() {
                cancelled.extend(supersede(engine, &superseded, &t.name, &account, &m, actions).await);
            }
        }
    }
    Ok(cancelled)
}

#[derive(Debug, Default, Deserialize)]
struct TenantsInput {
    /// None: every tenant.
    tenants: Option<Vec<String>>,
    #[serde(default)]
    cause: String,
}

/// `reconcile.tenant` and `reconcile.full`: every member of the tenants' groups against every
/// association under their accounts (one bulk cluster read), with the safety brake.
pub struct ReconcileTenants {
    pub reconciler: Arc<Reconciler>,
    pub full: bool,
}

impl Flow for ReconcileTenants {
    fn kind(&self) -> &'static str {
        if self.full { RECONCILE_FULL } else { RECONCILE_TENANT }
    }
    fn steps(&self) -> &'static [&'static str] {
        &["reconcile"]
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        policy()
    }
    fn run<'a>(&'a self, _: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let input: TenantsInput = match ctx.input() {
                Ok(i) => i,
                Err(t) => return t,
            };
            let r = &self.reconciler;
            let names = if self.full { None } else { input.tenants.clone() };
            match reconcile_tenants(r, names.as_deref(), &input.cause, Some(r.brake), None).await {
                Ok(v) => Transition::Done(v),
                Err(e) => retry_or_give_up(ctx, e),
            }
        })
    }
}

/// Plans and enqueues for the named tenants (all when None). With `only`, offboardings are
/// limited to those (account, user) pairs (a released hold).
async fn reconcile_tenants(
    r: &Reconciler,
    names: Option<&[String]>,
    cause: &str,
    brake: Option<plan::Brake>,
    only: Option<&[(SlurmAccount, Username)]>,
) -> Result<Value, String> {
    let tenants: Vec<_> =
        r.tenants.tenants.iter().filter(|t| names.is_none_or(|n| n.iter().any(|x| x == t.name.as_str()))).collect();
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
    let actual = r.cluster.associations(&accounts).await.map_err(|e| e.to_string())?;
    for (t, members) in ready {
        let counts = member_counts(t, &members, &actual);
        let mut p = plan::plan_tenant(&r.tenants, t, &members, &actual, brake);
        if let Some(only) = only {
            p.offboard.retain(|a| only.contains(&(a.account.clone(), a.username.clone())));
        }
        let mut actions = p.onboard.clone();
        actions.extend(p.offboard.iter().cloned());
        let restored = restore_in_tenant(r, t, &members, &mut actions).await?;
        let jobs = enqueue(r, &actions, cause).await?;
        let mut hold = Value::Null;
        if let Some(reason) = &p.brake_reason {
            tracing::warn!(tenant = %t.name, "{reason}");
            let held: Vec<Value> =
                p.held.iter().map(|a| json!({ "account": a.account, "username": a.username })).collect();
            let job = NewJob::new(
                RECONCILE_HOLD,
                &format!("reconcile/hold/{}", t.name),
                json!({ "tenant": t.name, "held": held, "reason": reason }),
                Actor::reconciler(),
            )
            .dedupe(format!("{RECONCILE_HOLD}:{}", t.name));
            let engine = r.engine().ok_or("not attached to an engine")?;
            hold = json!(engine.enqueue(&[job]).await.map_err(|e| e.to_string())?[0].id);
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

/// What was measured of a tenant: active members of each of its groups (`members`: of the tenant
/// group) and the Slurm user associations under its accounts.
fn member_counts(
    t: &crate::domain::tenants::Tenant,
    members: &BTreeMap<String, Vec<crate::backends::authentik::User>>,
    actual: &[(SlurmAccount, Username)],
) -> Value {
    let accounts = t.accounts();
    let mut by_account: BTreeMap<&str, usize> = accounts.iter().map(|a| (a.as_str(), 0)).collect();
    let mut users = std::collections::BTreeSet::new();
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

#[derive(Debug, Deserialize)]
struct HoldInput {
    tenant: String,
    held: Vec<HeldPair>,
    reason: String,
}

#[derive(Debug, Deserialize)]
struct HeldPair {
    account: SlurmAccount,
    username: Username,
}

/// `reconcile.hold`: waits for approval, then re-reads both sides and offboards those held users
/// who are still to be offboarded (approving days later after an outage ended offboards nobody).
pub struct ReconcileHold(pub Arc<Reconciler>);

impl Flow for ReconcileHold {
    fn kind(&self) -> &'static str {
        RECONCILE_HOLD
    }
    fn steps(&self) -> &'static [&'static str] {
        &["await_approval", "release"]
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        policy()
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let input: HoldInput = match ctx.input() {
                Ok(i) => i,
                Err(t) => return t,
            };
            if step == 0 {
                return if ctx.approved() {
                    Transition::Done(json!({ "approved_by": ctx.approved_by }))
                } else {
                    Transition::NeedsApproval(format!("{} (held: {})", input.reason, input.held.len()))
                };
            }
            let only: Vec<(SlurmAccount, Username)> = input.held.into_iter().map(|h| (h.account, h.username)).collect();
            let cause = format!("approved hold job {}", ctx.job_id);
            match reconcile_tenants(&self.0, Some(&[input.tenant]), &cause, None, Some(&only)).await {
                Ok(v) => Transition::Done(v),
                Err(e) => retry_or_give_up(ctx, e),
            }
        })
    }
}

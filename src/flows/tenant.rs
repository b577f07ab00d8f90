//! `tenant.onboard` and `tenant.offboard`: a whole tenant in and out, in the runbook's order.
//! Input: `{"tenant": "foo"}` (offboarding also takes `"hard_cutoff": true`).
//!
//! Offboarding's order is enforced, not hoped for: the engine runs the steps in order, and the
//! delete step refuses to run unless this job's snapshot and archive steps succeeded.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::backends::Backends;
use super::specs;
use crate::backends::slurm::{Deleted, JobScope};
use crate::backends::storage::{Dir, Quota, Snapshot, SnapshotName};
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::domain::tenants::Tenant;
use crate::engine::{Flow, NewJob, RetryPolicy, StepCtx, StepFuture, Transition};
use crate::step_try;

pub const TENANT_ONBOARD: &str = "tenant.onboard";
pub const TENANT_OFFBOARD: &str = "tenant.offboard";

crate::flows::steps! {
    /// The steps, in order (`OnboardStep::NAMES` are their names in the job history).
    pub enum OnboardStep {
        Accounts = "accounts",
        NetworkPolicy = "network_policy",
        ScratchQuota = "scratch_quota",
        Members = "members",
    }
}

pub const ONBOARD_STEPS: &[&str] = OnboardStep::NAMES;
crate::flows::steps! {
    /// The steps, in order (`OffboardStep::NAMES` are their names in the job history).
    pub enum OffboardStep {
        Block = "block",
        CancelPending = "cancel_pending",
        Drain = "drain",
        DeleteCluster = "delete_cluster",
        Snapshot = "snapshot",
        Archive = "archive",
        ReleaseNodes = "release_nodes",
        Retention = "retention",
        DeleteAccounts = "delete_accounts",
    }
}

pub const OFFBOARD_STEPS: &[&str] = OffboardStep::NAMES;

#[derive(Clone, Debug, Deserialize)]
pub struct Input {
    pub tenant: String,
    #[serde(default)]
    pub hard_cutoff: bool,
}

/// The job that onboards (or offboards) a tenant.
pub fn job(kind: &'static str, tenant: &str, actor: crate::engine::Actor) -> NewJob {
    NewJob::new(kind, &format!("{tenant}/tenant"), json!({ "tenant": tenant }), actor)
        .dedupe(format!("{kind}:{tenant}"))
}

/// `onramp tenant onboard|offboard T`: checks the tenant against the registry and enqueues its job.
pub async fn enqueue_cli(args: crate::app::cli::TenantArgs) -> anyhow::Result<()> {
    use crate::app::cli::TenantAction;
    let registry = crate::domain::tenants::TenantRegistry::load(&args.tenants)?;
    let (kind, tenant, hard_cutoff) = match &args.action {
        TenantAction::Onboard { tenant } => (TENANT_ONBOARD, tenant, false),
        TenantAction::Offboard { tenant, hard_cutoff } => (TENANT_OFFBOARD, tenant, *hard_cutoff),
    };
    anyhow::ensure!(registry.tenant(tenant).is_some(), "tenant {tenant:?} is not in the tenant registry");
    let pool = crate::app::db::connect(&args.db.database_url, 2).await?;
    let engine = crate::engine::Engine::new(pool, super::with_kinds_only(super::registry()));
    let actor = crate::engine::Actor::cli(&std::env::var("USER").unwrap_or_else(|_| "unknown".into()));
    let mut j = job(kind, tenant, actor);
    j.input["hard_cutoff"] = json!(hard_cutoff);
    let e = engine.enqueue(&[j]).await?[0];
    println!("{} {kind} job {}", if e.created { "enqueued" } else { "already pending:" }, e.id);
    Ok(())
}

fn checked(b: &Backends, ctx: &StepCtx) -> Result<(Input, Tenant, TenantName), Transition> {
    let input: Input = ctx.input()?;
    let t = b.tenant(&input.tenant)?.clone();
    let name = t.name.clone();
    Ok((input, t, name))
}

pub struct TenantOnboard(pub Arc<Backends>);

impl Flow for TenantOnboard {
    fn kind(&self) -> &'static str {
        TENANT_ONBOARD
    }
    fn steps(&self) -> &'static [&'static str] {
        ONBOARD_STEPS
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        self.0.policy(8)
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let b = &*self.0;
            let (_, t, name) = tri!(checked(b, ctx));
            match OnboardStep::ALL[step] {
                OnboardStep::Accounts => {
                    let spec = tri!(specs::tenant_spec(&t).map_err(Transition::Fail));
                    let e = step_try!(b.slurm.ensure_tenant(&spec).await, "create the tenant's accounts");
                    let accounts = t.accounts();
                    let assocs = step_try!(b.slurm.associations(&accounts).await, "read the accounts back");
                    let missing: Vec<&SlurmAccount> = accounts
                        .iter()
                        .filter(|a| !assocs.iter().any(|x| x.user.is_empty() && x.account == a.as_str()))
                        .collect();
                    if !missing.is_empty() {
                        return Transition::Retry(format!("Slurm does not show accounts {missing:?} yet"));
                    }
                    Transition::Done(json!({ "created": e.created, "changed": e.changed, "accounts": accounts }))
                }
                OnboardStep::NetworkPolicy => {
                    step_try!(b.k8s.apply_network_policy(&name).await, "apply the tenant's NetworkPolicy");
                    Transition::Done(json!({ "network_policy": format!("{name}-isolation"), "namespace": name }))
                }
                OnboardStep::ScratchQuota => {
                    let Some(q) = &t.quotas.scratch else {
                        return Transition::Done(json!({ "skipped": "the tenant has no scratch quota" }));
                    };
                    let quota = tri!(
                        Quota::parse(&q.hard, &q.soft).map_err(|e| Transition::Fail(format!("scratch quota: {e}")))
                    );
                    step_try!(b.storage.set_quota(&Dir::Scratch(name.clone()), quota).await, "set the scratch quota");
                    Transition::Done(json!({ "hard": q.hard, "soft": q.soft }))
                }
                OnboardStep::Members => members(b, &t).await,
            }
        })
    }
}

/// The group's current members: their associations in one batched `add user` per account, then
/// one `user.onboard` job each for the rest of the runbook (key, `$HOME`, smoke test, e-mail).
async fn members(b: &Backends, t: &Tenant) -> Transition {
    let mut members = BTreeMap::new();
    for g in t.groups() {
        let list = step_try!(b.authentik.active_members(g).await, "list the tenant's group members");
        members.insert(g.to_string(), list);
    }
    let users = crate::flows::reconcile::plan::groups_by_user(&members);
    let limits = tri!(specs::user_limits(t).map_err(Transition::Fail));
    let mut by_account: BTreeMap<SlurmAccount, Vec<(Username, crate::flows::reconcile::plan::Member)>> =
        BTreeMap::new();
    let mut skipped = vec![];
    for (u, groups) in users.values() {
        match crate::flows::reconcile::plan::member(&b.tenants, u) {
            Ok(m) => {
                for a in t.placement(groups) {
                    by_account.entry(a).or_default().push((m.username.clone(), m.clone()));
                }
            }
            Err(why) => skipped.push(why),
        }
    }
    let mut batches = vec![];
    let mut jobs = vec![];
    for (account, members) in &by_account {
        let names: Vec<Username> = members.iter().map(|(n, _)| n.clone()).collect();
        let e = step_try!(b.slurm.add_users(account, &names, true, &limits).await, "add the members (batched)");
        batches.push(json!({ "account": account, "users": names, "created": e.created, "changed": e.changed }));
        for (_, m) in members {
            let a = crate::flows::reconcile::plan::Action {
                op: crate::flows::reconcile::plan::Op::Onboard,
                tenant: t.name.clone(),
                account: account.clone(),
                username: m.username.clone(),
                member: Some(m.clone()),
                reason: format!("member of {} when the tenant was onboarded", t.group),
            };
            jobs.push(super::reconcile::job_for(&a, "tenant.onboard"));
        }
    }
    let ids: Vec<Value> = match b.engine() {
        Some(engine) if !jobs.is_empty() => match engine.enqueue(&jobs).await {
            Ok(e) => e.iter().map(|x| json!(x.id)).collect(),
            Err(e) => return Transition::Retry(format!("enqueue the members' onboarding: {e}")),
        },
        _ => vec![],
    };
    Transition::Done(json!({ "batches": batches, "onboarding_jobs": ids, "skipped": skipped }))
}

pub struct TenantOffboard(pub Arc<Backends>);

impl Flow for TenantOffboard {
    fn kind(&self) -> &'static str {
        TENANT_OFFBOARD
    }
    fn steps(&self) -> &'static [&'static str] {
        OFFBOARD_STEPS
    }
    fn policy(&self, _: usize) -> RetryPolicy {
        self.0.policy(8)
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let b = &*self.0;
            let (input, t, name) = tri!(checked(b, ctx));
            let scope = JobScope::Account(t.account.clone());
            match OffboardStep::ALL[step] {
                OffboardStep::Block => {
                    let e = step_try!(b.slurm.block_account(&t.account).await, "block the tenant (GrpJobs=0)");
                    Transition::Done(json!({ "account": t.account, "changed": e.changed }))
                }
                OffboardStep::CancelPending => {
                    let c = step_try!(b.slurm.cancel_pending(&scope).await, "cancel the tenant's pending jobs");
                    Transition::Done(json!({ "cancelled": c.cancelled, "remaining": c.remaining }))
                }
                OffboardStep::Drain => drain(b, &scope, input.hard_cutoff, ctx).await,
                OffboardStep::DeleteCluster => {
                    let d = step_try!(b.k8s.delete_slurm_cluster(&name).await, "delete the Slurm cluster resource");
                    Transition::Done(json!({ "slurm_cluster": format!("{d:?}") }))
                }
                OffboardStep::Snapshot => snapshot(b, &t, &name).await,
                OffboardStep::Archive => {
                    let r = step_try!(b.slurm.archive_dump(&b.archive_dir).await, "sacctmgr archive dump");
                    Transition::Done(json!({ "directory": r.directory, "written": r.written, "message": r.message }))
                }
                OffboardStep::ReleaseNodes => {
                    let nodes = step_try!(b.k8s.remove_node_labels(&name).await, "remove the tenant's node labels");
                    let r = step_try!(b.k8s.delete_reservation(&name).await, "delete the tenant's Reservation");
                    Transition::Done(json!({ "unlabelled": nodes, "reservation": format!("{r:?}") }))
                }
                OffboardStep::Retention => {
                    if ctx.waited {
                        Transition::Done(json!({ "retained_secs": b.timings.retention.as_secs() }))
                    } else {
                        Transition::Wait(b.timings.retention)
                    }
                }
                OffboardStep::DeleteAccounts => {
                    if let Err(why) = require_snapshot_and_archive(ctx) {
                        return Transition::Fail(why);
                    }
                    let d = step_try!(b.slurm.delete_account(&t.account).await, "delete the tenant's accounts");
                    let left = step_try!(b.slurm.associations(&t.accounts()).await, "read the accounts back");
                    if !left.is_empty() {
                        return Transition::Retry(format!(
                            "{} association(s) of the tenant are still there",
                            left.len()
                        ));
                    }
                    let removed = match d {
                        Deleted::Deleted { removed } => removed,
                        Deleted::AlreadyGone => vec![],
                    };
                    Transition::Done(json!({ "deleted": true, "removed": removed }))
                }
            }
        })
    }
}

async fn drain(b: &Backends, scope: &JobScope, hard_cutoff: bool, ctx: &StepCtx) -> Transition {
    let jobs = step_try!(b.slurm.jobs(scope).await, "list the tenant's jobs");
    let cutoff = hard_cutoff || ctx.approved();
    if jobs.is_empty() {
        return Transition::Done(json!({ "drained": true, "hard_cutoff": cutoff, "approved_by": ctx.approved_by }));
    }
    if cutoff {
        step_try!(b.slurm.cancel_all(scope).await, "cancel all the tenant's jobs (hard cutoff)");
        return Transition::Wait(b.timings.drain_poll);
    }
    if ctx.poll_expired() {
        return Transition::NeedsApproval(format!(
            "{scope} still has {} running job(s) after the drain deadline: approve to cancel them (hard cutoff)",
            jobs.len()
        ));
    }
    Transition::Poll { every: b.timings.drain_poll, for_at_most: b.timings.drain_deadline }
}

/// The tenant's scratch and its users' homes, before anything is deleted.
async fn snapshot(b: &Backends, t: &Tenant, name: &TenantName) -> Transition {
    let d = OffsetDateTime::now_utc().date();
    let date = format!("{:04}{:02}{:02}", d.year(), u8::from(d.month()), d.day());
    let mut taken = vec![];
    let scratch = tri!(
        SnapshotName::parse(&format!("offboard-final-{name}-{date}")).map_err(|e| Transition::Fail(e.to_string()))
    );
    let s = step_try!(b.storage.snapshot(&Dir::Scratch(name.clone()), &scratch).await, "snapshot scratch");
    taken.push(json!({ "snapshot": scratch.as_str(), "existed": s == Snapshot::Exists }));
    let assocs = step_try!(b.slurm.associations(&t.accounts()).await, "list the tenant's users");
    let mut users: Vec<&str> = assocs.iter().filter(|a| !a.user.is_empty()).map(|a| a.user.as_str()).collect();
    users.sort_unstable();
    users.dedup();
    for u in users {
        let Ok(user) = Username::parse(u) else { continue };
        let n = SnapshotName::offboard(&user, d);
        let s = step_try!(b.storage.snapshot(&Dir::Home(user.clone()), &n).await, "snapshot a user's $HOME");
        taken.push(json!({ "snapshot": n.as_str(), "existed": s == Snapshot::Exists }));
    }
    Transition::Done(json!({ "snapshots": taken }))
}

/// Deletion only after this job's snapshot and archive steps succeeded.
pub fn require_snapshot_and_archive(ctx: &StepCtx) -> Result<(), String> {
    let snap = ctx.output("snapshot").and_then(|o| o["snapshots"].as_array()).is_some_and(|a| !a.is_empty());
    let archive = ctx.output("archive").and_then(|o| o["directory"].as_str()).is_some();
    if snap && archive {
        Ok(())
    } else {
        Err(format!(
            "refused: the tenant's accounts are deleted only after this job's snapshot and archive succeeded \
             (snapshot: {}, archive: {})",
            if snap { "done" } else { "missing" },
            if archive { "done" } else { "missing" }
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(outputs: Value) -> StepCtx {
        StepCtx {
            job_id: 1,
            kind: TENANT_OFFBOARD.into(),
            subject: "foo/tenant".into(),
            input: json!({ "tenant": "foo" }),
            outputs: outputs.as_object().cloned().unwrap_or_default(),
            step: "delete_accounts",
            step_index: 8,
            attempt: 1,
            waited: false,
            poll_deadline: None,
            approved_by: None,
            cancel: Default::default(),
        }
    }

    #[test]
    fn accounts_are_deleted_only_after_this_jobs_snapshot_and_archive() {
        assert!(require_snapshot_and_archive(&ctx(json!({}))).unwrap_err().starts_with("refused"));
        let snap_only = json!({ "snapshot": { "snapshots": [{ "snapshot": "offboard-final-foo-20261130" }] } });
        assert!(require_snapshot_and_archive(&ctx(snap_only)).unwrap_err().contains("archive: missing"));
        let archive_only = json!({ "archive": { "directory": "/a" }, "snapshot": { "snapshots": [] } });
        assert!(require_snapshot_and_archive(&ctx(archive_only)).unwrap_err().contains("snapshot: missing"));
        let both = json!({ "snapshot": { "snapshots": [{}] }, "archive": { "directory": "/a" } });
        assert!(require_snapshot_and_archive(&ctx(both)).is_ok());
    }
}

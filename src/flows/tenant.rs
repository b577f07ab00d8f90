//! `tenant.onboard` and `tenant.offboard`: a whole tenant in and out, in the runbook's order.
//! Input: `{"tenant": "foo"}` (offboarding also takes `"hard_cutoff": true`).
//!
//! Offboarding's order is enforced, not hoped for: the engine runs the steps in order, and the
//! delete step refuses to run unless this job's snapshot and archive steps succeeded. Nothing
//! happens before a second person (not the job's starter) approves it, and a hard cutoff after
//! the drain deadline needs the same (four eyes).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::backends::{Backends, StepError};
use super::reconcile::plan::{self, Action, Member, Op};
use super::tenant_snapshots::{require_snapshot_and_archive, require_snapshots, snapshot};
use super::{StepResult, drain, finish, specs, verify};
use crate::backends::slurm::{Deleted, JobScope, QosSpec};
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::domain::tenants::Tenant;
use crate::engine::{Actor, Flow, NewJob, RetryPolicy, StepCtx, StepFuture, Transition};

pub const TENANT_ONBOARD: &str = "tenant.onboard";
pub const TENANT_OFFBOARD: &str = "tenant.offboard";

crate::flows::steps! {
    /// The steps, in order (`OnboardStep::NAMES` are their names in the job history).
    pub enum OnboardStep {
        Qos = "qos",
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
        Confirm = "confirm",
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

/// The input of both tenant flows.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Input {
    pub tenant: String,
    /// Offboarding: cancel running jobs at once instead of waiting for them.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hard_cutoff: bool,
}

impl Input {
    /// The job of `kind` (onboard or offboard) for this input: one unfinished job per tenant.
    pub fn job(&self, kind: &'static str, actor: Actor) -> NewJob {
        NewJob::typed(kind, &format!("{}/tenant", self.tenant), self, actor).dedupe(format!("{kind}:{}", self.tenant))
    }
}

/// The job that onboards (or offboards) a tenant.
pub fn job(kind: &'static str, tenant: &str, actor: Actor) -> NewJob {
    Input { tenant: tenant.into(), hard_cutoff: false }.job(kind, actor)
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
        self.0.policy(self.0.timings.retry_attempts)
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move { finish(self.step(OnboardStep::ALL[step], ctx).await) })
    }
}

impl TenantOnboard {
    async fn step(&self, step: OnboardStep, ctx: &StepCtx) -> StepResult {
        let b = &*self.0;
        let (_, t, _) = checked(b, ctx)?;
        match step {
            OnboardStep::Qos => qos(b, &t).await,
            OnboardStep::Accounts => {
                let spec = specs::tenant_spec(&t).map_err(Transition::Fail)?;
                let e = b.slurm.ensure_tenant(&spec).await.step("create the tenant's accounts")?;
                let accounts = t.accounts();
                let assocs = b.slurm.associations(&accounts).await.step("read the accounts back")?;
                let missing: Vec<&SlurmAccount> = accounts
                    .iter()
                    .filter(|a| !assocs.iter().any(|x| x.user.is_empty() && x.account == a.as_str()))
                    .collect();
                if !missing.is_empty() {
                    return Ok(Transition::Retry(format!("Slurm does not show accounts {missing:?} yet")));
                }
                Ok(Transition::Done(json!({ "created": e.created, "changed": e.changed, "accounts": accounts })))
            }
            OnboardStep::NetworkPolicy => verify::policy(b, &t.kubernetes, ctx).await,
            OnboardStep::ScratchQuota => match &t.quotas.scratch {
                Some(q) => verify::quota(b, &verify::scratch_place(&t), q, "scratch", ctx).await,
                None => Ok(Transition::Done(json!({ "skipped": "the tenant has no scratch quota" }))),
            },
            OnboardStep::Members => members(b, &t, ctx).await,
        }
    }
}

/// Before any association names them: the declared QOS the tenant's user defaults name, created
/// or converged; every QOS they name must then exist in Slurm.
async fn qos(b: &Backends, t: &Tenant) -> StepResult {
    let specs: Vec<QosSpec> = b
        .tenants
        .declared_qos(t)
        .into_iter()
        .map(QosSpec::from_decl)
        .collect::<Result<_, _>>()
        .map_err(Transition::Fail)?;
    let e = b.slurm.ensure_qos(&specs).await.step("create or converge the declared QOS")?;
    let names = t.qos_names();
    let have = b.slurm.qos(&names).await.step("read the QOS back")?;
    let missing: Vec<&str> = names.iter().map(|n| n.as_str()).filter(|n| !have.iter().any(|q| q.name == *n)).collect();
    if !missing.is_empty() {
        return Ok(Transition::Fail(format!(
            "tenant {}'s user_defaults name QOS {} that the registry's qos: list does not declare and Slurm does not \
             have: declare them in the registry (qos: - name: …) or create them (sacctmgr add qos)",
            t.name,
            missing.join(", ")
        )));
    }
    Ok(Transition::Done(json!({ "qos": names, "created": e.created, "changed": e.changed })))
}

/// The group's current members: their associations in one batched `add user` per account, then
/// one `user.onboard` job each for the rest of the runbook (key, `$HOME`, smoke test, e-mail).
async fn members(b: &Backends, t: &Tenant, ctx: &StepCtx) -> StepResult {
    let mut members = BTreeMap::new();
    for g in t.groups() {
        let list = b.authentik.active_members(g).await.step("list the tenant's group members")?;
        members.insert(g.to_string(), list);
    }
    let users = plan::groups_by_user(&members);
    let limits = specs::user_limits(t).map_err(Transition::Fail)?;
    let mut by_account: BTreeMap<SlurmAccount, Vec<(Username, Member)>> = BTreeMap::new();
    let mut skipped = vec![];
    for (u, groups) in users.values() {
        match plan::member(&b.tenants, u) {
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
        let e = b.slurm.add_users(account, &names, true, &limits).await.step("add the members (batched)")?;
        batches.push(json!({ "account": account, "users": names, "created": e.created, "changed": e.changed }));
        for (_, m) in members {
            let a = Action {
                op: Op::Onboard,
                tenant: t.name.clone(),
                account: account.clone(),
                username: m.username.clone(),
                member: Some(m.clone()),
                reason: format!("member of {} when the tenant was onboarded", t.group),
            };
            jobs.push(super::reconcile::job_for(&a, TENANT_ONBOARD));
        }
    }
    // a simulation (a plan) has no other jobs: it reports none enqueued
    let ids: Vec<Value> = match ctx.jobs() {
        Some(queue) if !jobs.is_empty() => match queue.enqueue(&jobs).await {
            Ok(e) => e.iter().map(|x| json!(x.id)).collect(),
            Err(e) => return Ok(Transition::Retry(format!("enqueue the members' onboarding: {e}"))),
        },
        _ => vec![],
    };
    Ok(Transition::Done(json!({ "batches": batches, "onboarding_jobs": ids, "skipped": skipped })))
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
        self.0.policy(self.0.timings.retry_attempts)
    }
    /// Starting it and a hard cutoff each need a second person.
    fn four_eyes(&self, step: usize) -> bool {
        matches!(OffboardStep::ALL[step], OffboardStep::Confirm | OffboardStep::Drain)
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move { finish(self.step(OffboardStep::ALL[step], ctx).await) })
    }
}

impl TenantOffboard {
    async fn step(&self, step: OffboardStep, ctx: &StepCtx) -> StepResult {
        let b = &*self.0;
        let (input, t, name) = checked(b, ctx)?;
        let scope = JobScope::Account(t.account.clone());
        match step {
            OffboardStep::Confirm => Ok(match &ctx.approved_by {
                Some(by) => Transition::Done(json!({ "approved_by": by })),
                None => Transition::NeedsApproval(format!(
                    "offboarding tenant {name} blocks its accounts, deletes its Slurm cluster and releases its \
                     nodes, and deletes its accounts after the retention period: someone other than the \
                     job's starter approves"
                )),
            }),
            OffboardStep::Block => {
                let e = b.slurm.block_account(&t.account).await.step("block the tenant (GrpJobs=0)")?;
                Ok(Transition::Done(json!({ "account": t.account, "changed": e.changed })))
            }
            OffboardStep::CancelPending => {
                let c = b.slurm.cancel_pending(&scope).await.step("cancel the tenant's pending jobs")?;
                Ok(Transition::Done(json!({ "cancelled": c.cancelled, "remaining": c.remaining })))
            }
            OffboardStep::Drain => drain::drain(b, &scope, "the tenant's", input.hard_cutoff, ctx).await,
            OffboardStep::DeleteCluster => verify::cluster_gone(b, &t.kubernetes, ctx).await,
            OffboardStep::Snapshot => snapshot(b, &t, &name).await,
            OffboardStep::Archive => {
                let export = super::archive::tenant_export_name(&name, super::archive::today());
                super::archive::archive(b, &scope, &export).await
            }
            OffboardStep::ReleaseNodes => {
                let k = &t.kubernetes;
                let nodes = b.k8s.remove_node_labels(k).await.step("remove the tenant's node labels")?;
                let r = b.k8s.delete_reservation(k).await.step("delete the tenant's Reservation")?;
                Ok(Transition::Done(
                    json!({ "unlabelled": nodes, "label": k.node_label, "reservation": format!("{r:?}"),
                                            "reservation_name": k.reservation }),
                ))
            }
            OffboardStep::Retention => Ok(if ctx.waited {
                Transition::Done(json!({ "retained_secs": b.timings.retention.as_secs() }))
            } else {
                Transition::Wait(b.timings.retention)
            }),
            OffboardStep::DeleteAccounts => {
                require_snapshot_and_archive(ctx).map_err(Transition::Fail)?;
                let step = OffboardStep::Archive.name();
                let intact = super::archive::require_archive_intact(b, ctx, step, &scope).await?;
                require_snapshots(b, &t, ctx).await?;
                let d = b.slurm.delete_account(&t.account).await.step("delete the tenant's accounts")?;
                let left = b.slurm.associations(&t.accounts()).await.step("read the accounts back")?;
                if !left.is_empty() {
                    let n = left.len();
                    return Ok(Transition::Retry(format!("{n} association(s) of the tenant are still there")));
                }
                let removed = match d {
                    Deleted::Deleted { removed } => removed,
                    Deleted::AlreadyGone => vec![],
                };
                Ok(Transition::Done(json!({ "deleted": true, "removed": removed, "archive": intact })))
            }
        }
    }
}

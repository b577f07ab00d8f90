//! `user.offboard`: the runbook's "Offboarding flow: user departure". Only a user with an
//! association under the tenant's account: the first step reads it and refuses, changing
//! nothing, when there is none. Block, cancel pending,
//! drain (or a hard cutoff, approved or asked for), disable in Authentik and remove the key,
//! notify, keep everything for the retention period (a durable timer), snapshot `$HOME` and
//! archive accounting (the user's records in the account exported with sacct, see
//! [`super::archive`]), and only after both, with the export re-read as written and the snapshot
//! still there: delete the association, and the user record with the last one. A user who is an
//! active member again by then is restored (unblocked) instead of deleted.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::json;
use time::OffsetDateTime;

use super::backends::{Backends, IntoTransition, StepError};
use super::user_onboard::{Names, names};
use super::{StepResult, archive, drain, finish, specs};
use crate::backends::notify::{Offboarding, Recipient};
use crate::backends::slurm::{Deleted, JobScope};
use crate::backends::storage::{Dir, Snapshot, SnapshotName};
use crate::domain::names::TenantName;
use crate::engine::{Actor, Flow, NewJob, RetryPolicy, StepCtx, StepFuture, Transition};

/// The kind of job this flow runs.
pub const USER_OFFBOARD: &str = "user.offboard";

crate::flows::steps! {
    /// The steps, in order (`Step::NAMES` are their names in the job history).
    pub enum Step {
        Block = "block",
        CancelPending = "cancel_pending",
        Drain = "drain",
        DisableLogin = "disable_login",
        Notify = "notify",
        Retention = "retention",
        SnapshotHome = "snapshot_home",
        Archive = "archive",
        Delete = "delete",
    }
}

pub const STEPS: &[&str] = Step::NAMES;

/// The job's input, as the reconciler and the API write it.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct Input {
    pub tenant: String,
    pub account: String,
    pub username: String,
    /// Cancel running jobs at once instead of waiting for them (no approval needed).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hard_cutoff: bool,
    /// Why the job was asked for (the reconciler's reason, the API's token).
    #[serde(default)]
    pub reason: String,
    /// What caused it (a webhook delivery, a periodic pass, an API caller).
    #[serde(default)]
    pub cause: String,
}

impl Input {
    /// The offboarding job of this input: one unfinished job per (account, user).
    pub fn job(&self, actor: Actor) -> NewJob {
        super::user_job(USER_OFFBOARD, (&self.tenant, &self.account, &self.username), self, actor)
    }
}

/// `disable_login`'s output: what became of the Authentik account and the key.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Disabled {
    pub authentik: String,
    pub key_removed: bool,
    /// Where the notification goes (empty: nowhere known).
    #[serde(default)]
    pub email: String,
}

/// `retention`'s output: when it ended and the name the snapshot gets.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Retained {
    pub retained_secs: u64,
    pub ended: String,
    pub snapshot: String,
}

/// `snapshot_home`'s output.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct HomeSnapshot {
    pub snapshot: String,
    #[serde(default)]
    pub existed: bool,
}

pub use super::archive::Archived;

pub struct UserOffboard(pub Arc<Backends>);

impl Flow for UserOffboard {
    fn kind(&self) -> &'static str {
        USER_OFFBOARD
    }
    fn steps(&self) -> &'static [&'static str] {
        STEPS
    }
    fn policy(&self, step: usize) -> RetryPolicy {
        match Step::ALL[step] {
            // A notification gives up after fewer tries; its failure never undoes the flow.
            Step::Notify => self.0.policy(4),
            _ => self.0.policy(self.0.timings.retry_attempts),
        }
    }
    /// The drain's approval is a hard cutoff: a second person gives it.
    fn four_eyes(&self, step: usize) -> bool {
        Step::ALL[step] == Step::Drain
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move { finish(self.step(Step::ALL[step], ctx).await) })
    }
}

impl UserOffboard {
    async fn step(&self, step: Step, ctx: &StepCtx) -> StepResult {
        let input: Input = ctx.input()?;
        let n = names(&input.tenant, &input.account, &input.username)?;
        let b = &*self.0;
        // this association and its jobs only: the user may belong to other teams or tenants
        // (leaving a tenant altogether offboards each of their associations there)
        let accounts = vec![n.account.clone()];
        let scope = JobScope::UserIn(n.user.clone(), accounts.clone());
        match step {
            Step::Block => {
                // only a user of this tenant: their association, read before anything is changed
                let t = b.tenant(n.tenant.as_str())?;
                if !t.accounts().contains(&n.account) {
                    let why = format!("refused: account {} is not one of tenant {}'s accounts", n.account, n.tenant);
                    return Err(Transition::Fail(why));
                }
                let before = b.slurm.user(&n.user).await.step("read the user's associations")?;
                let has = before.iter().flat_map(|s| &s.assocs).any(|a| a.account == n.account.as_str());
                if !has {
                    return Err(Transition::Fail(format!(
                        "refused: {} has no association under account {} (tenant {}); only a user who has one is \
                         offboarded, and nothing was changed",
                        n.user, n.account, n.tenant
                    )));
                }
                let e = b.slurm.block_user(&n.user, &accounts).await.step("block the user")?;
                let state = b.slurm.user(&n.user).await.step("read the user back")?;
                let ours: Vec<&crate::backends::slurm::Association> = state
                    .iter()
                    .flat_map(|s| &s.assocs)
                    .filter(|a| accounts.iter().any(|x| x.as_str() == a.account))
                    .collect();
                if let Some(a) = ours.iter().find(|a| !a.is_blocked()) {
                    return Ok(Transition::Retry(format!("{} does not show as blocked in {} yet", n.user, a.account)));
                }
                let blocked: Vec<&str> = ours.iter().map(|a| a.account.as_str()).collect();
                let elsewhere: Vec<&str> = state
                    .iter()
                    .flat_map(|s| &s.assocs)
                    .filter(|a| !accounts.iter().any(|x| x.as_str() == a.account))
                    .map(|a| a.account.as_str())
                    .collect();
                Ok(Transition::Done(json!({ "changed": e.changed, "blocked": blocked, "left_alone": elsewhere })))
            }
            Step::CancelPending => {
                let c = b.slurm.cancel_pending(&scope).await.step("cancel pending jobs")?;
                Ok(Transition::Done(json!({ "cancelled": c.cancelled, "remaining": c.remaining })))
            }
            Step::Drain => drain::drain(b, &scope, "the user's", input.hard_cutoff, ctx).await,
            Step::DisableLogin => disable(b, &n, ctx).await,
            Step::Notify => notify(b, &n, ctx).await,
            Step::Retention => {
                if !ctx.waited {
                    return Ok(Transition::Wait(b.timings.retention));
                }
                let today = OffsetDateTime::now_utc().date();
                Ok(Transition::done(&Retained {
                    retained_secs: b.timings.retention.as_secs(),
                    ended: today.to_string(),
                    snapshot: SnapshotName::offboard(&n.user, today).as_str().to_string(),
                }))
            }
            Step::SnapshotHome => {
                let Some(r) = ctx.output_of::<Retained>(Step::Retention.name()) else {
                    return Ok(Transition::Fail("refused: the retention step has not ended".into()));
                };
                let name = SnapshotName::parse(&r.snapshot).map_err(|e| Transition::Fail(e.to_string()))?;
                let s = b.storage.snapshot(&home_of(b, &n), &name).await.step("snapshot $HOME")?;
                let out = HomeSnapshot { snapshot: name.as_str().to_string(), existed: s == Snapshot::Exists };
                Ok(Transition::done(&out))
            }
            Step::Archive => {
                let name = archive::user_export_name(&n.tenant, &n.account, &n.user, archive::today());
                archive::archive(b, &scope, &name).await
            }
            Step::Delete => delete(b, &n, &scope, ctx).await,
        }
    }
}

/// Runbook step 4: deactivate in Authentik and remove the key from this tenant's Secret when
/// onramp manages keys. The account is left active (and why is recorded) when the user is still
/// in a tenant's group (this one's or another's), when Authentik does not say which groups they
/// are in, or when this job's `block` step found no association of theirs.
async fn disable(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    let user = match b.authentik.user_by_username(n.user.as_str()).await {
        Ok(u) => Some(u),
        Err(crate::backends::authentik::AuthentikError::NotFound(_)) => None,
        Err(e) => return Err(e.transition("read the user from Authentik")),
    };
    let blocked = ctx
        .output(Step::Block.name())
        .and_then(|o| o.get("blocked"))
        .and_then(|b| b.as_array())
        .is_some_and(|a| !a.is_empty());
    let deactivated = match &user {
        None => "not in Authentik",
        Some(u) if !u.is_active => "already deactivated",
        Some(u) if !u.knows_group_names() => "left active: Authentik did not say which groups the user is in",
        Some(u) => {
            let tenants: Vec<TenantName> = b.tenants.placements(&u.group_names()).into_iter().map(|(t, _)| t).collect();
            if tenants.iter().any(|t| *t != n.tenant) {
                // which tenant is not said: this job is seen by this tenant's tokens
                "left active: still a member of another tenant"
            } else if !tenants.is_empty() {
                "left active: still a member of this tenant's group"
            } else if !blocked {
                "left active: this job found no association of the user"
            } else {
                b.authentik.deactivate(u.pk).await.step("deactivate the user in Authentik")?;
                "deactivated"
            }
        }
    };
    let mut key_removed = false;
    if b.k8s_settings.manage_keys {
        let k = b.k8s_names(&n.tenant)?;
        let a = b.k8s.remove_key(k, &n.user).await.step("remove the key from the Secret")?;
        key_removed = a == crate::backends::kubernetes::keys::Applied::Changed;
    }
    let email = user.map(|u| u.email).unwrap_or_default();
    Ok(Transition::done(&Disabled { authentik: deactivated.into(), key_removed, email }))
}

async fn notify(b: &Backends, n: &Names, ctx: &StepCtx) -> StepResult {
    let Some(notifier) = &b.notifier else {
        return Ok(Transition::Done(json!({ "sent": false, "why": "no notification channel is configured" })));
    };
    let email = ctx.output_of::<Disabled>(Step::DisableLogin.name()).map(|d| d.email).unwrap_or_default();
    let until = OffsetDateTime::now_utc() + b.timings.retention;
    let msg =
        Offboarding { user: n.user.clone(), tenant: n.tenant.clone(), retained_until: Some(until.date().to_string()) }
            .message();
    let to = Recipient { user: n.user.clone(), email: (!email.is_empty()).then_some(email.clone()) };
    Ok(match super::welcome::send_once(notifier.as_ref(), ctx, &to, msg).await? {
        Ok(_) => Transition::Done(json!({ "sent": true, "to": email })),
        Err(e) if e.is_retryable() && ctx.attempt < 4 => Transition::Retry(e.to_string()),
        Err(e) => Transition::Done(json!({ "sent": false, "error": e.to_string() })),
    })
}

/// Only after the snapshot and the archive of this job succeeded, and while the archive's export
/// is on the Slurm host as written. A user who is an active member placed under the account again
/// is restored (unblocked) instead. The user record goes with the last association; one with
/// associations elsewhere (another tenant's) keeps it, and them.
async fn delete(b: &Backends, n: &Names, scope: &JobScope, ctx: &StepCtx) -> StepResult {
    require_archived(ctx).map_err(Transition::Fail)?;
    match b.authentik.user_by_username(n.user.as_str()).await {
        Ok(u) if u.is_active && b.tenants.placements(&u.group_names()).iter().any(|(_, a)| a == &n.account) => {
            let tenant = b.tenant(n.tenant.as_str())?;
            let limits = specs::user_limits(tenant).map_err(Transition::Fail)?;
            let account = std::slice::from_ref(&n.account);
            b.slurm.unblock_user(&n.user, account, &limits).await.step("restore the re-added user")?;
            return Ok(Transition::Done(json!({ "deleted": false, "restored": true,
                                               "why": "active member again: restored instead of deleted" })));
        }
        Ok(_) | Err(crate::backends::authentik::AuthentikError::NotFound(_)) => {}
        Err(e) => return Err(e.transition("re-check the user in Authentik")),
    }
    let intact = archive::require_archive_intact(b, ctx, Step::Archive.name(), scope).await?;
    require_snapshot(b, n, ctx).await?;
    let d = b.slurm.delete_user_association(&n.user, &n.account).await.step("delete the Slurm association")?;
    let after = b.slurm.user(&n.user).await.step("read the user back")?;
    if after.as_ref().is_some_and(|s| s.assocs.iter().any(|a| a.account == n.account.as_str())) {
        return Ok(Transition::Retry(format!("{}'s association with {} is still there", n.user, n.account)));
    }
    let removed = match d {
        Deleted::Deleted { removed } => removed,
        Deleted::AlreadyGone => vec![],
    };
    let (record, kept_by) = match b.slurm.user_record(&n.user).await.step("read the user record")? {
        // Slurm removes a user record with its last association
        None => ("gone", vec![]),
        Some(r) if !r.associations.is_empty() => ("kept", r.associations),
        Some(_) => {
            b.slurm.delete_user(&n.user).await.step("delete the user record")?;
            if b.slurm.user_record(&n.user).await.step("read the user record back")?.is_some() {
                return Ok(Transition::Retry(format!("{}'s user record is still there", n.user)));
            }
            ("deleted", vec![])
        }
    };
    Ok(Transition::Done(json!({ "deleted": true, "removed": removed, "user_record": record,
                               "user_record_kept_by": kept_by, "archive": intact })))
}

/// The snapshot this job's `snapshot_home` step took must still be there. Filesystems answer a
/// snapshot taken again under its name with "already exists", which is the check (their CLIs have
/// no common read-only one). One that was gone (deleted by hand) has just been taken again from
/// `$HOME` as it is now (this flow deletes nothing of the home); the delete waits for a person,
/// who looks at it and retries the job.
async fn require_snapshot(b: &Backends, n: &Names, ctx: &StepCtx) -> Result<(), Transition> {
    let Some(s) = ctx.output_of::<HomeSnapshot>(Step::SnapshotHome.name()) else {
        return Err(Transition::Fail("refused: this job's snapshot step recorded no snapshot".into()));
    };
    let name = SnapshotName::parse(&s.snapshot).map_err(|e| Transition::Fail(e.to_string()))?;
    match b.storage.snapshot(&home_of(b, n), &name).await.step("check the snapshot of $HOME")? {
        Snapshot::Exists => Ok(()),
        Snapshot::Created => Err(Transition::Fail(format!(
            "refused: the snapshot {} of {}'s $HOME was gone at the delete step (deleted by hand?); nothing was \
             deleted. It was taken again now from $HOME as it is; check it, then retry the job to delete",
            name.as_str(),
            n.user
        ))),
    }
}

/// Where the user's `$HOME` is: the registry's path when the tenant is still in it, else the
/// settings' template.
fn home_of(b: &Backends, n: &Names) -> crate::backends::storage::Place {
    match b.tenants.tenant(n.tenant.as_str()) {
        Some(t) => super::verify::home_place(t, &n.user),
        None => Dir::Home(n.user.clone()).into(),
    }
}

/// The order the runbook insists on: a delete only after this job's snapshot and archive succeeded.
pub fn require_archived(ctx: &StepCtx) -> Result<(), String> {
    let snap = ctx.output_of::<HomeSnapshot>(Step::SnapshotHome.name()).is_some();
    let archive = ctx.output_of::<Archived>(Step::Archive.name()).is_some();
    match (snap, archive) {
        (true, true) => Ok(()),
        _ => Err(format!(
            "refused: delete runs only after this job's snapshot and archive succeeded (snapshot: {}, archive: {})",
            if snap { "done" } else { "missing" },
            if archive { "done" } else { "missing" }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(outputs: serde_json::Value) -> StepCtx {
        let outputs = outputs.as_object().cloned().unwrap_or_default();
        StepCtx::detached(USER_OFFBOARD, "t/u", json!({}), outputs, Step::Delete.name(), 8)
    }

    #[test]
    fn delete_is_refused_without_this_jobs_snapshot_and_archive() {
        let e = require_archived(&ctx(json!({}))).unwrap_err();
        assert!(e.contains("refused") && e.contains("snapshot: missing, archive: missing"), "{e}");
        let e = require_archived(&ctx(json!({ "snapshot_home": { "snapshot": "offboard-u-20261130" } }))).unwrap_err();
        assert!(e.contains("archive: missing"), "{e}");
        let both = json!({ "snapshot_home": { "snapshot": "s" }, "archive": { "directory": "/a" } });
        assert!(require_archived(&ctx(both)).is_ok());
    }
}

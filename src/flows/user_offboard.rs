//! `user.offboard`: the runbook's "Offboarding flow: user departure". Block, cancel pending,
//! drain (or a hard cutoff, approved or asked for), disable in Authentik and remove the key,
//! notify, keep everything for the retention period (a durable timer), snapshot `$HOME` and
//! archive accounting, and only after both: delete the association. A user who is an active
//! member again by then is restored (unblocked) instead of deleted.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use time::OffsetDateTime;

use super::backends::Backends;
use super::specs;
use super::user_onboard::{Names, names};
use crate::backends::notify::{Offboarding, Recipient};
use crate::backends::slurm::{Deleted, JobScope};
use crate::backends::storage::{Dir, Snapshot, SnapshotName};
use crate::engine::{Flow, RetryPolicy, StepCtx, StepFuture, Transition};
use crate::flows::reconcile::USER_OFFBOARD;
use crate::step_try;

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

#[derive(Clone, Debug, Deserialize)]
pub struct Input {
    pub tenant: String,
    pub account: String,
    pub username: String,
    /// Cancel running jobs at once instead of waiting for them (no approval needed).
    #[serde(default)]
    pub hard_cutoff: bool,
}

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
            _ => self.0.policy(8),
        }
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async move {
            let input: Input = tri!(ctx.input());
            let n = tri!(names(&input.tenant, &input.account, &input.username));
            let b = &*self.0;
            // this association and its jobs only: the user may belong to other teams or tenants
            // (leaving a tenant altogether offboards each of their associations there)
            let accounts = vec![n.account.clone()];
            let scope = JobScope::UserIn(n.user.clone(), accounts.clone());
            match Step::ALL[step] {
                Step::Block => {
                    let e = step_try!(b.slurm.block_user(&n.user, &accounts).await, "block the user");
                    let state = step_try!(b.slurm.user(&n.user).await, "read the user back");
                    let ours: Vec<&crate::backends::slurm::Association> = state
                        .iter()
                        .flat_map(|s| &s.assocs)
                        .filter(|a| accounts.iter().any(|x| x.as_str() == a.account))
                        .collect();
                    if let Some(a) = ours.iter().find(|a| !a.is_blocked()) {
                        return Transition::Retry(format!("{} does not show as blocked in {} yet", n.user, a.account));
                    }
                    let blocked: Vec<&str> = ours.iter().map(|a| a.account.as_str()).collect();
                    let elsewhere: Vec<&str> = state
                        .iter()
                        .flat_map(|s| &s.assocs)
                        .filter(|a| !accounts.iter().any(|x| x.as_str() == a.account))
                        .map(|a| a.account.as_str())
                        .collect();
                    Transition::Done(json!({ "changed": e.changed, "blocked": blocked, "left_alone": elsewhere }))
                }
                Step::CancelPending => {
                    let c = step_try!(b.slurm.cancel_pending(&scope).await, "cancel pending jobs");
                    Transition::Done(json!({ "cancelled": c.cancelled, "remaining": c.remaining }))
                }
                Step::Drain => drain(b, &scope, &input, ctx).await,
                Step::DisableLogin => disable(b, &n).await,
                Step::Notify => notify(b, &n, ctx).await,
                Step::Retention => {
                    if !ctx.waited {
                        return Transition::Wait(b.timings.retention);
                    }
                    let today = OffsetDateTime::now_utc().date();
                    Transition::Done(
                        json!({ "retained_secs": b.timings.retention.as_secs(), "ended": today.to_string(),
                                             "snapshot": SnapshotName::offboard(&n.user, today).as_str() }),
                    )
                }
                Step::SnapshotHome => {
                    let Some(name) = ctx.output("retention").and_then(|o| o["snapshot"].as_str()) else {
                        return Transition::Fail("refused: the retention step has not ended".into());
                    };
                    let name = tri!(SnapshotName::parse(name).map_err(|e| Transition::Fail(e.to_string())));
                    let s = step_try!(b.storage.snapshot(&Dir::Home(n.user.clone()), &name).await, "snapshot $HOME");
                    Transition::Done(json!({ "snapshot": name.as_str(), "existed": s == Snapshot::Exists }))
                }
                Step::Archive => {
                    let r = step_try!(b.slurm.archive_dump(&b.archive_dir).await, "sacctmgr archive dump");
                    Transition::Done(json!({ "directory": r.directory, "written": r.written, "message": r.message }))
                }
                Step::Delete => delete(b, &n, ctx).await,
            }
        })
    }
}

/// Waits for running jobs to end, up to the drain deadline; then a hard cutoff needs approval
/// (or was asked for in the input).
async fn drain(b: &Backends, scope: &JobScope, input: &Input, ctx: &StepCtx) -> Transition {
    let jobs = step_try!(b.slurm.jobs(scope).await, "list the user's jobs");
    if jobs.is_empty() {
        let cutoff = input.hard_cutoff || ctx.approved();
        return Transition::Done(json!({ "drained": true, "hard_cutoff": cutoff, "approved_by": ctx.approved_by }));
    }
    if input.hard_cutoff || ctx.approved() {
        let c = step_try!(b.slurm.cancel_all(scope).await, "cancel all jobs (hard cutoff)");
        if c.remaining.is_empty() {
            return Transition::Done(json!({ "drained": true, "hard_cutoff": true, "cancelled": c.cancelled,
                                            "approved_by": ctx.approved_by }));
        }
        // Cancelled jobs take a moment to end: look again (a wait, not a failed attempt).
        return Transition::Wait(b.timings.drain_poll);
    }
    if ctx.poll_expired() {
        let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        return Transition::NeedsApproval(format!(
            "{} still has {} running job(s) ({}) after the drain deadline: approve to cancel them (hard cutoff)",
            scope,
            jobs.len(),
            ids.join(", ")
        ));
    }
    Transition::Poll { every: b.timings.drain_poll, for_at_most: b.timings.drain_deadline }
}

/// Runbook step 4: deactivate in Authentik (unless already, or still a member of another
/// tenant) and remove the key from the tenant's Secret when onramp manages keys.
async fn disable(b: &Backends, n: &Names) -> Transition {
    let user = match b.authentik.user_by_username(n.user.as_str()).await {
        Ok(u) => Some(u),
        Err(crate::backends::authentik::AuthentikError::NotFound(_)) => None,
        Err(e) => return crate::flows::backends::IntoTransition::transition(e, "read the user from Authentik"),
    };
    let deactivated = match &user {
        None => json!("not in Authentik"),
        Some(u) if !u.is_active => json!("already deactivated"),
        Some(u) if !b.tenants.placements(&u.group_names()).is_empty() => {
            json!("left active: still a member of another tenant")
        }
        Some(u) => {
            step_try!(b.authentik.deactivate(u.pk).await, "deactivate the user in Authentik");
            json!("deactivated")
        }
    };
    let mut key_removed = false;
    if b.k8s_settings.manage_keys {
        let a = step_try!(b.k8s.remove_key(&n.tenant, &n.user).await, "remove the key from the Secret");
        key_removed = a == crate::backends::kubernetes::keys::Applied::Changed;
    }
    Transition::Done(json!({ "authentik": deactivated, "key_removed": key_removed,
                             "email": user.map(|u| u.email).unwrap_or_default() }))
}

async fn notify(b: &Backends, n: &Names, ctx: &StepCtx) -> Transition {
    let Some(notifier) = &b.notifier else {
        return Transition::Done(json!({ "sent": false, "why": "no notification channel is configured" }));
    };
    let email = ctx.output("disable_login").and_then(|o| o["email"].as_str()).unwrap_or_default().to_string();
    let until = OffsetDateTime::now_utc() + b.timings.retention;
    let msg =
        Offboarding { user: n.user.clone(), tenant: n.tenant.clone(), retained_until: Some(until.date().to_string()) }
            .message();
    let to = Recipient { user: n.user.clone(), email: (!email.is_empty()).then_some(email.clone()) };
    match notifier.send(&to, &msg).await {
        Ok(()) => Transition::Done(json!({ "sent": true, "to": email })),
        Err(e) if e.is_retryable() && ctx.attempt < 4 => Transition::Retry(e.to_string()),
        Err(e) => Transition::Done(json!({ "sent": false, "error": e.to_string() })),
    }
}

/// Only after the snapshot and the archive of this job succeeded. A user who is an active
/// member placed under the account again is restored (unblocked) instead.
async fn delete(b: &Backends, n: &Names, ctx: &StepCtx) -> Transition {
    if let Err(why) = require_archived(ctx) {
        return Transition::Fail(why);
    }
    match b.authentik.user_by_username(n.user.as_str()).await {
        Ok(u) if u.is_active && b.tenants.placements(&u.group_names()).iter().any(|(_, a)| a == &n.account) => {
            let tenant = tri!(b.tenant(n.tenant.as_str()));
            let limits = tri!(specs::user_limits(tenant).map_err(Transition::Fail));
            let account = std::slice::from_ref(&n.account);
            step_try!(b.slurm.unblock_user(&n.user, account, &limits).await, "restore the re-added user");
            return Transition::Done(json!({ "deleted": false, "restored": true,
                                            "why": "active member again: restored instead of deleted" }));
        }
        Ok(_) | Err(crate::backends::authentik::AuthentikError::NotFound(_)) => {}
        Err(e) => return crate::flows::backends::IntoTransition::transition(e, "re-check the user in Authentik"),
    }
    let d = step_try!(b.slurm.delete_user_association(&n.user, &n.account).await, "delete the Slurm association");
    let after = step_try!(b.slurm.user(&n.user).await, "read the user back");
    if after.as_ref().is_some_and(|s| s.assocs.iter().any(|a| a.account == n.account.as_str())) {
        return Transition::Retry(format!("{}'s association with {} is still there", n.user, n.account));
    }
    let removed = match d {
        Deleted::Deleted { removed } => removed,
        Deleted::AlreadyGone => vec![],
    };
    Transition::Done(json!({ "deleted": true, "removed": removed, "user_record_left": after.is_some() }))
}

/// The order the runbook insists on: a delete only after this job's snapshot and archive succeeded.
pub fn require_archived(ctx: &StepCtx) -> Result<(), String> {
    let snap = ctx.output("snapshot_home").and_then(|o| o["snapshot"].as_str());
    let archive = ctx.output("archive").and_then(|o| o["directory"].as_str());
    match (snap, archive) {
        (Some(_), Some(_)) => Ok(()),
        _ => Err(format!(
            "refused: delete runs only after this job's snapshot and archive succeeded (snapshot: {}, archive: {})",
            if snap.is_some() { "done" } else { "missing" },
            if archive.is_some() { "done" } else { "missing" }
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx(outputs: serde_json::Value) -> StepCtx {
        StepCtx {
            job_id: 1,
            kind: USER_OFFBOARD.into(),
            subject: "t/u".into(),
            input: json!({}),
            outputs: outputs.as_object().cloned().unwrap_or_default(),
            step: "delete",
            step_index: 8,
            attempt: 1,
            waited: false,
            poll_deadline: None,
            approved_by: None,
            cancel: Default::default(),
        }
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

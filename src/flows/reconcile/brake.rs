//! The one brake every reconcile offboarding goes through, from a tenant pass or a single user's
//! reconcile: each offboarding that has no job yet takes a slot of the shared budget
//! ([`OFFBOARD_BUDGET`]); past it, and whatever a pass's own check held, it is held for the one
//! `reconcile.hold` job, which a person approves to release the whole held set.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::Reconciler;
use super::enqueue::job_for;
use super::hold::hold_job;
use super::plan::{Action, OFFBOARD_BUDGET};
use crate::domain::names::{SlurmAccount, Username};
use crate::engine::{Jobs, Metered, Through};
use crate::flows::user_offboard::USER_OFFBOARD;

/// An offboarding the brake holds, as the hold's release needs it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct HeldOffboard {
    pub tenant: String,
    pub account: SlurmAccount,
    pub username: Username,
    pub reason: String,
}

impl HeldOffboard {
    fn of(a: &Action) -> Self {
        Self {
            tenant: a.tenant.to_string(),
            account: a.account.clone(),
            username: a.username.clone(),
            reason: a.reason.clone(),
        }
    }
}

/// Whether offboardings take slots of the budget or were released by a person.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Mode {
    /// Within the budget; the rest is held.
    Metered,
    /// Approved: all go, and count against the budget.
    Released,
}

/// What became of some offboardings.
#[derive(Debug, Default)]
pub(super) struct Offboarded {
    /// One entry per offboarding started (or found under way), as `enqueue` reports them.
    pub jobs: Vec<Value>,
    /// `account/username` of each one held.
    pub held: Vec<String>,
    pub hold_job: Option<i64>,
    /// Why the budget held some (None when it held none).
    pub reason: Option<String>,
}

/// Distinct users with an association under the registry's accounts.
pub(super) fn managed_users(actual: &[(SlurmAccount, Username)]) -> usize {
    actual.iter().map(|(_, u)| u).collect::<BTreeSet<_>>().len()
}

/// Starts `offboard` through the budget; `whole` (the pass's own check: why, and whom) is held
/// as it is. `managed`: users with associations, which sets the budget's limit.
pub(super) async fn offboard(
    r: &Reconciler,
    queue: &Jobs,
    mode: Mode,
    managed: usize,
    offboard: &[Action],
    whole: Option<(&str, &[Action])>,
    cause: &str,
) -> Result<Offboarded, String> {
    let mut out = Offboarded::default();
    if !queue.accepts(USER_OFFBOARD) {
        for a in offboard.iter().chain(whole.map_or(&[][..], |(_, w)| w)) {
            tracing::warn!(user = %a.username, "no flow for user.offboard in this build: not enqueued");
            out.jobs.push(json!({ "op": a.op, "account": a.account, "username": a.username, "reason": a.reason,
                                  "job": null, "note": "not enqueued: this build has no flow for the job kind" }));
        }
        return Ok(out);
    }
    if offboard.is_empty() && whole.is_none() {
        // nothing to meter or hold: the budget's lock (one row, shared by every path and
        // replica) is not taken, so user reconciles with nothing to offboard do not queue on it
        return Ok(out);
    }
    let budget = r.brake.budget(managed);
    let metered: Vec<Metered> =
        offboard.iter().map(|a| Metered::new(job_for(a, cause), &HeldOffboard::of(a))).collect();
    let key = |a: &Action| job_for(a, cause).dedupe_key.unwrap_or_default();
    let whole_items: Vec<(String, Value)> = whole
        .map_or(&[][..], |(_, w)| w)
        .iter()
        .map(|a| (key(a), serde_json::to_value(HeldOffboard::of(a)).expect("plain data")))
        .collect();
    let reason = format!(
        "safety brake: the offboarding budget ({} per {}s across all tenants: the larger of {} and {}% of {} managed users) \
         is used up; further offboardings wait for a person's approval",
        budget.limit,
        budget.window.as_secs(),
        r.brake.min_users,
        r.brake.max_percent,
        managed
    );
    let release = hold_job(whole.map_or(reason.as_str(), |(why, _)| why));
    let through = Through {
        metered: &metered,
        hold: &whole_items,
        reason: &reason,
        hold_reason: whole.map_or("", |(why, _)| why),
        release: Some(&release),
        force: mode == Mode::Released,
    };
    let done = queue.enqueue_through(&budget, &through).await.map_err(|e| e.to_string())?;
    for (a, e) in offboard.iter().zip(&done.jobs) {
        match e {
            Some(e) => out.jobs.push(json!({ "op": a.op, "account": a.account, "username": a.username,
                                             "reason": a.reason, "job": e.id, "new": e.created })),
            None => {
                out.held.push(format!("{}/{}", a.account, a.username));
                out.reason = Some(reason.clone());
            }
        }
    }
    if let Some((why, w)) = whole {
        tracing::warn!("{why}");
        out.held.extend(w.iter().map(|a| format!("{}/{}", a.account, a.username)));
    }
    if let Some(reason) = &out.reason {
        tracing::warn!(held = out.held.len(), used = done.used, limit = done.limit, "{reason}");
    }
    out.hold_job = done.release.map(|e| e.id);
    Ok(out)
}

/// The held set, oldest first, and the ids to forget once released.
pub(super) async fn held(queue: &Jobs) -> Result<(Vec<HeldOffboard>, Vec<i64>), String> {
    let held = queue.held::<HeldOffboard>(OFFBOARD_BUDGET).await.map_err(|e| e.to_string())?;
    Ok((held.iter().map(|h| h.item.clone()).collect(), held.iter().map(|h| h.id).collect()))
}

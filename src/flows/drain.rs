//! The drain step shared by `user.offboard` and `tenant.offboard`: wait for the scope's running
//! jobs to end, up to the drain deadline; then a hard cutoff needs approval (or was asked for in
//! the job's input).
//!
//! The two flows had drifted apart; this keeps the union of their checks: after a hard cutoff the
//! step is done only when Slurm shows nothing left of the scope (else it looks again after the
//! drain poll), and the approval request names the jobs still running.

use serde::{Deserialize, Serialize};

use super::StepResult;
use super::backends::{Backends, StepError};
use crate::backends::slurm::JobScope;
use crate::engine::{StepCtx, Transition};

/// The drain step's output.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Drained {
    pub drained: bool,
    pub hard_cutoff: bool,
    /// The jobs the hard cutoff cancelled (when it found some).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled: Option<Vec<String>>,
    pub approved_by: Option<String>,
}

/// How a flow names the scope in its errors: `whose` is "the user's" or "the tenant's".
pub async fn drain(b: &Backends, scope: &JobScope, whose: &str, hard_cutoff: bool, ctx: &StepCtx) -> StepResult {
    let jobs = b.slurm.jobs(scope).await.step(&format!("list {whose} jobs"))?;
    let cutoff = hard_cutoff || ctx.approved();
    if jobs.is_empty() {
        let out = Drained { drained: true, hard_cutoff: cutoff, cancelled: None, approved_by: ctx.approved_by.clone() };
        return Ok(Transition::done(&out));
    }
    if cutoff {
        let c = b.slurm.cancel_all(scope).await.step(&format!("cancel all {whose} jobs (hard cutoff)"))?;
        if c.remaining.is_empty() {
            let out = Drained {
                drained: true,
                hard_cutoff: true,
                cancelled: Some(c.cancelled),
                approved_by: ctx.approved_by.clone(),
            };
            return Ok(Transition::done(&out));
        }
        // Cancelled jobs take a moment to end: look again (a wait, not a failed attempt).
        return Ok(Transition::Wait(b.timings.drain_poll));
    }
    if ctx.poll_expired() {
        let ids: Vec<&str> = jobs.iter().map(|j| j.id.as_str()).collect();
        return Ok(Transition::NeedsApproval(format!(
            "{scope} still has {} running job(s) ({}) after the drain deadline: approve to cancel them (hard cutoff)",
            jobs.len(),
            ids.join(", ")
        )));
    }
    Ok(Transition::Poll { every: b.timings.drain_poll, for_at_most: b.timings.drain_deadline })
}

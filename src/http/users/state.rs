//! A user's state in a tenant, read from their latest onboarding or offboarding job: what it is
//! and a sentence saying why. Pure: the caller reads the jobs.

use serde::Serialize;
use time::OffsetDateTime;

use crate::engine::{Job, JobState};
use crate::flows::user_offboard::{self, USER_OFFBOARD};
use crate::flows::user_onboard::{self, USER_ONBOARD};

/// The states of the users API (see openapi.yaml, `UserStatus.state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UserState {
    Onboarded,
    Onboarding,
    WaitingForKey,
    WaitingForApproval,
    Failed,
    Blocked,
    InRetention,
    Offboarding,
    Offboarded,
    NotOnboarded,
}

/// What a job says of its user.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub state: UserState,
    pub reason: String,
    /// The current step, while the job is not finished (or failed / waiting for approval there).
    pub step: Option<String>,
    pub retention_until: Option<OffsetDateTime>,
}

pub fn rfc3339(t: OffsetDateTime) -> String {
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// `max_attempts`: of the job's current step, when this process knows the flow.
pub fn read(job: &Job, max_attempts: Option<u32>) -> Reading {
    let step = Some(job.step.clone());
    let error = job.last_error.as_deref().unwrap_or("no error was recorded");
    let attempt = match max_attempts {
        Some(m) => format!("attempt {} of {m}", job.attempt.max(1)),
        None => format!("attempt {}", job.attempt.max(1)),
    };
    let r = |state, reason: String, step: Option<String>| Reading { state, reason, step, retention_until: None };
    let when = |t: Option<OffsetDateTime>| t.map(rfc3339).unwrap_or_else(|| "an unknown time".into());
    match (job.kind.as_str(), job.state) {
        (_, JobState::NeedsApproval) => {
            r(UserState::WaitingForApproval, format!("waiting for approval: {error}"), step)
        }
        (USER_ONBOARD, JobState::Succeeded) => {
            r(UserState::Onboarded, format!("onboarded by job {} at {}", job.id, when(job.finished_at)), None)
        }
        (USER_OFFBOARD, JobState::Succeeded) => {
            r(UserState::Offboarded, format!("offboarded by job {} at {}", job.id, when(job.finished_at)), None)
        }
        (_, JobState::Cancelled) => r(
            UserState::NotOnboarded,
            format!("job {} ({}) was cancelled at step {}; no onboarding has succeeded", job.id, job.kind, job.step),
            None,
        ),
        (USER_ONBOARD, JobState::Failed) if no_key(job) => r(
            UserState::WaitingForKey,
            format!("waiting for the user's SSH public key: {error} (then retry job {})", job.id),
            step,
        ),
        (_, JobState::Failed) => r(UserState::Failed, format!("failed at step {}: {error}", job.step), step),
        (USER_ONBOARD, _) if job.step == user_onboard::Step::KeyInSecret.name() => r(
            UserState::WaitingForKey,
            format!("waiting for the user's SSH public key to appear in the tenant's key Secret ({attempt})"),
            step,
        ),
        (USER_ONBOARD, s) => {
            r(UserState::Onboarding, format!("onboarding at step {}, {attempt}{}", job.step, until(job, s)), step)
        }
        (USER_OFFBOARD, s) => offboarding(job, s, &attempt),
        (kind, s) => r(UserState::Onboarding, format!("{kind} at step {} ({s})", job.step), step),
    }
}

/// Whether an onboarding failed because the user has no usable SSH public key in Authentik.
fn no_key(job: &Job) -> bool {
    job.step == user_onboard::Step::ResolveUser.name()
        && job.last_error.as_deref().is_some_and(|e| e.contains("no usable SSH public key"))
}

fn until(job: &Job, s: JobState) -> String {
    if s == JobState::Waiting { format!(", waiting until {}", rfc3339(job.run_at)) } else { String::new() }
}

/// An offboarding in flight: blocked until its retention, in retention, then deleting.
fn offboarding(job: &Job, s: JobState, attempt: &str) -> Reading {
    let retention = user_offboard::Step::Retention.name();
    let at = user_offboard::STEPS.iter().position(|n| *n == job.step).unwrap_or(0);
    let retention_at = user_offboard::STEPS.iter().position(|n| *n == retention).unwrap_or(usize::MAX);
    let step = Some(job.step.clone());
    if at < retention_at {
        let how = if at == 0 { "being blocked in Slurm" } else { "blocked in Slurm" };
        return Reading {
            state: UserState::Blocked,
            reason: format!("offboarding: {how}, at step {}, {attempt}{}", job.step, until(job, s)),
            step,
            retention_until: None,
        };
    }
    if at == retention_at {
        let waiting = s == JobState::Waiting;
        let until = waiting.then_some(job.run_at);
        let reason = match until {
            Some(t) => format!("offboarded and blocked; the user's data is kept until {} (retention)", rfc3339(t)),
            None => "offboarded and blocked; the retention period starts".to_string(),
        };
        return Reading { state: UserState::InRetention, reason, step, retention_until: until };
    }
    Reading {
        state: UserState::Offboarding,
        reason: format!("retention over: deleting, at step {}, {attempt}", job.step),
        step,
        retention_until: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use time::macros::datetime;

    use super::*;

    fn job(kind: &str, state: JobState, step: &str, error: Option<&str>) -> Job {
        let t = datetime!(2026-11-30 12:00 UTC);
        Job {
            id: 7,
            kind: kind.into(),
            subject: "foo/alice".into(),
            tenant: "foo".into(),
            dedupe_key: None,
            state,
            input: json!({}),
            outputs: json!({}),
            step_index: 0,
            step: step.into(),
            attempt: 2,
            run_at: datetime!(2026-12-30 12:00 UTC),
            lease_owner: None,
            poll_deadline: None,
            approved_by: None,
            last_error: error.map(String::from),
            created_by: "reconciler".into(),
            created_at: t,
            updated_at: t,
            finished_at: state.is_closed().then_some(t),
        }
    }

    #[test]
    fn each_job_says_its_state_and_why() {
        let r = read(&job(USER_ONBOARD, JobState::Running, "slurm_association", None), Some(8));
        assert_eq!(r.state, UserState::Onboarding);
        assert_eq!(r.reason, "onboarding at step slurm_association, attempt 2 of 8");
        let r = read(&job(USER_ONBOARD, JobState::Failed, "smoke_test", Some("sbatch refused")), Some(8));
        assert_eq!((r.state, r.reason.as_str()), (UserState::Failed, "failed at step smoke_test: sbatch refused"));
        let e = "alice has no usable SSH public key in Authentik (attributes.sshPublicKey); ask them to add one";
        let r = read(&job(USER_ONBOARD, JobState::Failed, "resolve_user", Some(e)), None);
        assert_eq!(r.state, UserState::WaitingForKey);
        let r = read(&job(USER_OFFBOARD, JobState::NeedsApproval, "drain", Some("hard cutoff of alice")), None);
        assert_eq!(
            (r.state, r.reason.as_str()),
            (UserState::WaitingForApproval, "waiting for approval: hard cutoff of alice")
        );
        let r = read(&job(USER_OFFBOARD, JobState::Waiting, "retention", None), None);
        assert_eq!((r.state, r.retention_until), (UserState::InRetention, Some(datetime!(2026-12-30 12:00 UTC))));
        assert_eq!(read(&job(USER_OFFBOARD, JobState::Running, "drain", None), None).state, UserState::Blocked);
        assert_eq!(read(&job(USER_OFFBOARD, JobState::Running, "delete", None), None).state, UserState::Offboarding);
        let r = read(&job(USER_OFFBOARD, JobState::Succeeded, "delete", None), None);
        assert_eq!((r.state, r.step), (UserState::Offboarded, None));
    }
}

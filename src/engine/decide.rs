//! From a step's transition to what the engine writes: pure, so it is tested without a database.

use std::time::Duration;

use super::store::{Claimed, StepWrite};
use super::{JobState, RetryPolicy, StepOutcome, Transition};

pub(crate) struct Situation<'a> {
    pub claimed: &'a Claimed,
    pub steps: &'static [&'static str],
    pub policy: RetryPolicy,
    pub lease: Duration,
    /// Carry on to the next step in this worker (false while shutting down).
    pub continue_here: bool,
    pub poll_expired: bool,
    /// A uniform draw from [0, 1) for jitter.
    pub jitter: f64,
}

pub(crate) fn decide(s: &Situation<'_>, t: Transition) -> StepWrite {
    let c = s.claimed;
    let idx = c.step_index;
    let step = s.steps[idx as usize];
    let used = (c.attempt - c.attempt_floor).max(1) as u32;
    let mut w = StepWrite {
        id: c.id,
        step_index: idx,
        attempt: c.attempt,
        step,
        outcome: StepOutcome::Done,
        new_state: JobState::Pending,
        new_step_index: idx,
        new_step: step,
        delay: Duration::ZERO,
        poll_for: Duration::ZERO,
        error: None,
        output: None,
        effects: None,
    };
    let fail = |mut w: StepWrite, msg: String| {
        w.outcome = StepOutcome::Fail;
        w.new_state = JobState::Failed;
        w.error = Some(msg);
        w
    };
    match t {
        Transition::Done(out) => {
            w.output = Some(out);
            if (idx as usize) + 1 >= s.steps.len() {
                w.new_state = JobState::Succeeded;
            } else {
                w.new_step_index = idx + 1;
                w.new_step = s.steps[idx as usize + 1];
                if s.continue_here {
                    w.new_state = JobState::Running;
                    w.delay = s.lease;
                }
            }
            w
        }
        Transition::Retry(e) | Transition::RetryNotBefore(e, _) if s.policy.exhausted(used) => {
            fail(w, format!("gave up after {used} attempts: {e}"))
        }
        Transition::Retry(e) => {
            w.outcome = StepOutcome::Retry;
            w.delay = s.policy.delay(used, s.jitter);
            w.error = Some(e);
            w
        }
        Transition::RetryNotBefore(e, after) => {
            w.outcome = StepOutcome::Retry;
            w.delay = s.policy.delay(used, s.jitter).max(after.min(s.policy.max_delay));
            w.error = Some(e);
            w
        }
        Transition::Wait(d) => {
            w.outcome = StepOutcome::Wait;
            w.new_state = JobState::Waiting;
            w.delay = d;
            w
        }
        Transition::Poll { .. } if s.poll_expired => {
            fail(w, format!("step {step} was still polling when its deadline passed"))
        }
        Transition::Poll { every, for_at_most } => {
            w.outcome = StepOutcome::Poll;
            w.new_state = JobState::Waiting;
            w.delay = every;
            w.poll_for = for_at_most;
            w
        }
        Transition::Fail(e) => fail(w, e),
        Transition::NeedsApproval(reason) => {
            w.outcome = StepOutcome::NeedsApproval;
            w.new_state = JobState::NeedsApproval;
            w.error = Some(reason);
            w
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, json};

    const STEPS: &[&str] = &["a", "b"];

    fn claimed(step_index: i32, attempt: i32, floor: i32) -> Claimed {
        Claimed {
            id: 7,
            kind: "k".into(),
            subject: "s".into(),
            tenant: "s".into(),
            traceparent: None,
            created_at: time::OffsetDateTime::UNIX_EPOCH,
            input: json!({}),
            outputs: Map::new(),
            step_index,
            attempt,
            attempt_floor: floor,
            step_waited: false,
            poll_deadline: None,
            approved_by: None,
        }
    }

    fn sit(c: &Claimed) -> Situation<'_> {
        Situation {
            claimed: c,
            steps: STEPS,
            policy: RetryPolicy { max_attempts: 3, ..RetryPolicy::default() },
            lease: Duration::from_secs(10),
            continue_here: true,
            poll_expired: false,
            jitter: 1.0,
        }
    }

    #[test]
    fn done_moves_on_in_the_same_worker_and_the_last_step_succeeds() {
        let c = claimed(0, 1, 0);
        let w = decide(&sit(&c), Transition::Done(json!(1)));
        assert_eq!(
            (w.new_state, w.new_step_index, w.new_step, w.delay),
            (JobState::Running, 1, "b", Duration::from_secs(10))
        );
        let c = claimed(1, 1, 0);
        let w = decide(&sit(&c), Transition::Done(json!(2)));
        assert_eq!((w.new_state, w.output), (JobState::Succeeded, Some(json!(2))));
    }

    #[test]
    fn done_while_shutting_down_leaves_the_next_step_pending() {
        let c = claimed(0, 1, 0);
        let w = decide(&Situation { continue_here: false, ..sit(&c) }, Transition::Done(json!(null)));
        assert_eq!((w.new_state, w.new_step_index, w.delay), (JobState::Pending, 1, Duration::ZERO));
    }

    #[test]
    fn retry_backs_off_until_the_budget_is_spent_counting_from_the_floor() {
        let c = claimed(0, 2, 0);
        let w = decide(&sit(&c), Transition::Retry("boom".into()));
        assert_eq!((w.outcome, w.new_state, w.delay), (StepOutcome::Retry, JobState::Pending, Duration::from_secs(4)));
        let c = claimed(0, 3, 0);
        let w = decide(&sit(&c), Transition::Retry("boom".into()));
        assert_eq!((w.outcome, w.new_state), (StepOutcome::Fail, JobState::Failed));
        assert_eq!(w.error.as_deref(), Some("gave up after 3 attempts: boom"));
        // after a manual retry the budget starts again at the floor
        let c = claimed(0, 5, 3);
        let w = decide(&sit(&c), Transition::Retry("boom".into()));
        assert_eq!(w.new_state, JobState::Pending);
    }

    #[test]
    fn a_retry_the_server_asked_to_delay_waits_at_least_that_within_the_cap() {
        let c = claimed(0, 1, 0);
        let late = Transition::RetryNotBefore("429".into(), Duration::from_secs(30));
        let w = decide(&sit(&c), late);
        assert_eq!(
            (w.outcome, w.delay, w.error.as_deref()),
            (StepOutcome::Retry, Duration::from_secs(30), Some("429"))
        );
        // sooner than the backoff: the backoff
        let w = decide(&sit(&c), Transition::RetryNotBefore("429".into(), Duration::from_millis(10)));
        assert_eq!(w.delay, Duration::from_secs(2));
        let capped = RetryPolicy { max_delay: Duration::from_secs(5), ..sit(&c).policy };
        let w = decide(
            &Situation { policy: capped, ..sit(&c) },
            Transition::RetryNotBefore("x".into(), Duration::from_secs(99)),
        );
        assert_eq!(w.delay, Duration::from_secs(5));
        let c = claimed(0, 3, 0);
        let w = decide(&sit(&c), Transition::RetryNotBefore("429".into(), Duration::from_secs(1)));
        assert_eq!(w.new_state, JobState::Failed);
    }

    #[test]
    fn poll_past_its_deadline_fails() {
        let c = claimed(0, 1, 0);
        let p = Transition::Poll { every: Duration::from_secs(1), for_at_most: Duration::from_secs(5) };
        assert_eq!(decide(&sit(&c), p.clone()).new_state, JobState::Waiting);
        assert_eq!(decide(&Situation { poll_expired: true, ..sit(&c) }, p).new_state, JobState::Failed);
    }

    #[test]
    fn approval_and_failure_keep_the_reason() {
        let c = claimed(1, 1, 0);
        let w = decide(&sit(&c), Transition::NeedsApproval("hard cutoff".into()));
        assert_eq!((w.new_state, w.error.as_deref()), (JobState::NeedsApproval, Some("hard cutoff")));
        let w = decide(&sit(&c), Transition::Fail("no such tenant".into()));
        assert_eq!((w.new_state, w.error.as_deref()), (JobState::Failed, Some("no such tenant")));
    }
}

//! Retry policy as data: declared per step, applied by the engine.

use std::time::Duration;

/// How a step is retried when it returns [`crate::engine::Transition::Retry`] or times out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included; after the last one the job fails.
    pub max_attempts: u32,
    /// Delay before the second attempt.
    pub initial_delay: Duration,
    /// Upper bound of any delay.
    pub max_delay: Duration,
    /// Growth of the delay from one attempt to the next.
    pub factor: f64,
    /// One attempt may run this long; then it counts as a retryable failure.
    pub timeout: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_delay: Duration::from_secs(2),
            max_delay: Duration::from_secs(600),
            factor: 2.0,
            timeout: Duration::from_secs(300),
        }
    }
}

impl RetryPolicy {
    /// The delay after failed attempt number `attempt` (1-based) before its cap and jitter.
    pub fn base_delay(&self, attempt: u32) -> Duration {
        let exp = self.factor.powi(attempt.saturating_sub(1).min(64) as i32);
        let secs = self.initial_delay.as_secs_f64() * exp;
        Duration::from_secs_f64(secs.min(self.max_delay.as_secs_f64()))
    }

    /// The delay after failed attempt `attempt`, with "equal jitter": a uniform draw between half
    /// the capped delay and the capped delay, so retries of many jobs spread out but never come
    /// sooner than half the schedule. `unit` is a draw from [0, 1).
    pub fn delay(&self, attempt: u32, unit: f64) -> Duration {
        let base = self.base_delay(attempt).as_secs_f64();
        Duration::from_secs_f64(base / 2.0 + base / 2.0 * unit.clamp(0.0, 1.0))
    }

    /// Whether attempt number `used` (counted in the current retry budget) was the last allowed.
    pub fn exhausted(&self, used: u32) -> bool {
        used >= self.max_attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 5,
            initial_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
            factor: 3.0,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn schedule_grows_by_factor_and_is_capped() {
        let p = policy();
        let got: Vec<u64> = (1..=5).map(|a| p.base_delay(a).as_millis() as u64).collect();
        assert_eq!(got, vec![1_000, 3_000, 9_000, 10_000, 10_000]);
    }

    #[test]
    fn jitter_stays_between_half_and_full_delay() {
        let p = policy();
        assert_eq!(p.delay(2, 0.0), Duration::from_millis(1_500));
        assert_eq!(p.delay(2, 1.0), Duration::from_millis(3_000));
        for i in 0..100 {
            let d = p.delay(3, fastrand::f64());
            assert!(d >= Duration::from_millis(4_500) && d <= Duration::from_millis(9_000), "draw {i}: {d:?}");
        }
    }

    #[test]
    fn huge_attempt_numbers_do_not_overflow() {
        assert_eq!(policy().base_delay(u32::MAX), Duration::from_secs(10));
    }

    #[test]
    fn budget_is_exhausted_at_max_attempts() {
        assert!(!policy().exhausted(4));
        assert!(policy().exhausted(5));
    }
}

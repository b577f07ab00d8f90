//! The flows' settings: the runbook's waits and where the accounting archive goes.

use std::time::Duration;

use super::Timings;

/// The flows: the runbook's waits and where the accounting archive goes.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowSettings {
    /// The Secret-propagation wait before the login pod is expected to have a new key (runbook: 60 s).
    pub propagation_wait: Duration,
    /// How long a user's key may take to appear in the tenant's key Secret.
    pub key_deadline: Duration,
    /// How long running jobs may drain before a hard cutoff needs approval.
    pub drain_deadline: Duration,
    /// How long the operator may take to remove a deleted SlurmCluster's NodeSets, pods and Secrets.
    pub cleanup_deadline: Duration,
    /// How long a departed user's data is kept before the snapshot, archive and deletion.
    pub retention: Duration,
    /// Where `sacctmgr archive dump` writes, on the slurmctld host.
    pub archive_dir: String,
    /// Attempts of a step before its job fails (notifications: their own, smaller budget).
    pub retry_attempts: u32,
    /// Delay before a failed step's first retry (doubling up to `retry_max`).
    pub retry_initial: Duration,
    /// The longest delay between two attempts of a failed step.
    pub retry_max: Duration,
}

impl Default for FlowSettings {
    /// The defaults `--help` shows (a test in `app::cli` keeps them equal).
    fn default() -> Self {
        Self {
            propagation_wait: Duration::from_secs(60),
            key_deadline: Duration::from_secs(15 * 60),
            drain_deadline: Duration::from_secs(7 * 86400),
            cleanup_deadline: Duration::from_secs(10 * 60),
            retention: Duration::from_secs(30 * 86400),
            archive_dir: "/var/spool/slurm/archive".into(),
            retry_attempts: 8,
            retry_initial: Duration::from_secs(2),
            retry_max: Duration::from_secs(120),
        }
    }
}

impl FlowSettings {
    pub fn timings(&self) -> Timings {
        Timings {
            propagation: self.propagation_wait,
            restart_wait: self.propagation_wait,
            key_deadline: self.key_deadline,
            drain_deadline: self.drain_deadline,
            cleanup_deadline: self.cleanup_deadline,
            retention: self.retention,
            retry_initial: self.retry_initial,
            retry_max: self.retry_max,
            retry_attempts: self.retry_attempts,
            ..Timings::default()
        }
    }
}

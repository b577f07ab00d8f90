//! The flows' settings: the runbook's waits and where the accounting archive goes.

use std::time::Duration;

use clap::Args;

use super::Timings;
use crate::domain::duration::parse_duration;

#[derive(Clone, Debug, Args)]
pub struct FlowArgs {
    /// The Secret-propagation wait before the login pod is expected to have a new key (runbook: 60 s).
    #[arg(long, env = "ONRAMP_PROPAGATION_WAIT", default_value = "60s", value_parser = parse_duration)]
    pub propagation_wait: Duration,
    /// How long a user's key may take to appear in the tenant's key Secret.
    #[arg(long, env = "ONRAMP_KEY_DEADLINE", default_value = "15m", value_parser = parse_duration)]
    pub key_deadline: Duration,
    /// How long running jobs may drain before a hard cutoff needs approval.
    #[arg(long, env = "ONRAMP_DRAIN_DEADLINE", default_value = "7d", value_parser = parse_duration)]
    pub drain_deadline: Duration,
    /// How long a departed user's data is kept before the snapshot, archive and deletion.
    #[arg(long, env = "ONRAMP_RETENTION", default_value = "30d", value_parser = parse_duration)]
    pub retention: Duration,
    /// Where `sacctmgr archive dump` writes, on the slurmctld host.
    #[arg(long, env = "ONRAMP_ARCHIVE_DIR", default_value = "/var/spool/slurm/archive")]
    pub archive_dir: String,
}

impl FlowArgs {
    pub fn timings(&self) -> Timings {
        Timings {
            propagation: self.propagation_wait,
            restart_wait: self.propagation_wait,
            key_deadline: self.key_deadline,
            drain_deadline: self.drain_deadline,
            retention: self.retention,
            ..Timings::default()
        }
    }
}

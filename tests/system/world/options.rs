//! How a world is made: the Slurm route, the replicas, the tenants, the settings.

use std::collections::BTreeMap;

/// How onramp reaches `sacctmgr` (`ONRAMP_SLURM_VIA`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlurmVia {
    /// On this host, as a sidecar or a host with the Slurm client would.
    Local,
    /// In the slurmctld pod, through the Kubernetes exec API (the fake runs it here).
    KubeExec,
}

impl SlurmVia {
    pub fn setting(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::KubeExec => "kube-exec",
        }
    }
}

pub struct Options {
    pub slurm_via: SlurmVia,
    pub workers: usize,
    /// `api` replicas (each its own process and port; the first is `World::api`).
    pub apis: usize,
    /// How many of `cluster::tenants()` the world has (2: foo, bar; 3: and baz).
    pub tenants: usize,
    /// A PostgreSQL server of the world's own (stopped with the world) instead of a database on
    /// the shared one: for scenarios that stop and start it (`Db::stop`, `Db::start`).
    pub own_postgres: bool,
    /// Settings beyond deploy/'s and the world's own (timers, concurrency), by variable.
    pub settings: BTreeMap<String, String>,
}

impl Options {
    /// Two workers with short timers, so a run takes a couple of minutes.
    pub fn new(slurm_via: SlurmVia) -> Self {
        let settings = [
            ("ONRAMP_PROPAGATION_WAIT", "1s"),
            ("ONRAMP_KEY_DEADLINE", "2m"),
            ("ONRAMP_LEASE", "5s"),
            ("ONRAMP_POLL_INTERVAL", "1s"),
            ("ONRAMP_WEBHOOK_SETTLE", "1s"),
            ("ONRAMP_SHUTDOWN_GRACE", "5s"),
            ("ONRAMP_LOG", "info"),
        ];
        let settings = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Self { slurm_via, workers: 2, apis: 1, tenants: 2, own_postgres: false, settings }
    }
}

//! What the user and tenant flows act on: one handle per external system (each a trait object,
//! so a dry run or a test can stand in), the tenant registry, and the timings of the runbook's
//! waits (configurable, so tests shorten them on the same code path).

use std::sync::Arc;
use std::time::Duration;

use crate::backends::authentik::{Authentik, AuthentikError};
use crate::backends::kubernetes::login::{LoginError, LoginPod};
use crate::backends::kubernetes::{K8sError, K8sSettings, Kubernetes};
use crate::backends::notify::Notifier;
use crate::backends::slurm::{HostPath, Slurm, SlurmError};
use crate::backends::storage::{Storage, StorageError};
use crate::domain::names::TenantName;
use crate::domain::tenants::{K8sNames, Tenant, TenantRegistry};
use crate::engine::Transition;

/// The runbook's waits and deadlines.
#[derive(Clone, Debug)]
pub struct Timings {
    /// How often to look for the user's key in the tenant's Secret.
    pub key_poll: Duration,
    /// How long the key may take to appear in the Secret before the job fails.
    pub key_deadline: Duration,
    /// The Secret-propagation wait (the runbook's 60 s), a durable timer.
    pub propagation: Duration,
    /// The wait after a login rollout restart before checking the key again.
    pub restart_wait: Duration,
    /// How often to look at a draining user's or tenant's running jobs.
    pub drain_poll: Duration,
    /// How long running jobs may drain before a hard cutoff needs approval.
    pub drain_deadline: Duration,
    /// How often to look whether a deleted SlurmCluster's objects are gone.
    pub cleanup_poll: Duration,
    /// How long the operator may take to remove them before the job needs attention.
    pub cleanup_deadline: Duration,
    /// How long a departed user's or tenant's data is kept before deletion (30 days).
    pub retention: Duration,
    /// The first retry delay of a failed step (doubling up to `retry_max`).
    pub retry_initial: Duration,
    /// The longest delay between two attempts of a failed step (two minutes).
    pub retry_max: Duration,
    /// Attempts of a step before its job fails and waits for a person.
    pub retry_attempts: u32,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            key_poll: Duration::from_secs(10),
            key_deadline: Duration::from_secs(15 * 60),
            propagation: Duration::from_secs(60),
            restart_wait: Duration::from_secs(60),
            drain_poll: Duration::from_secs(5 * 60),
            drain_deadline: Duration::from_secs(7 * 24 * 3600),
            cleanup_poll: Duration::from_secs(10),
            cleanup_deadline: Duration::from_secs(10 * 60),
            retention: Duration::from_secs(30 * 24 * 3600),
            retry_initial: Duration::from_secs(2),
            retry_max: Duration::from_secs(120),
            retry_attempts: 8,
        }
    }
}

/// Everything the user and tenant flows need.
pub struct Backends {
    pub slurm: Arc<dyn Slurm>,
    pub k8s: Arc<dyn Kubernetes>,
    /// Names and paths on the login pods (home root, skel, run-as, smoke gres) and `manage_keys`.
    pub k8s_settings: K8sSettings,
    pub storage: Arc<dyn Storage>,
    /// `None`: nobody is notified (recorded in the step's output).
    pub notifier: Option<Arc<dyn Notifier>>,
    pub authentik: Arc<dyn Authentik>,
    pub tenants: Arc<TenantRegistry>,
    pub timings: Timings,
    /// Where `sacctmgr archive dump` writes, on the Slurm host.
    pub archive_dir: HostPath,
    /// How long one command in a login pod may take.
    pub command_timeout: Duration,
    /// The login address users are told to SSH to.
    pub login_address: String,
}

impl Backends {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        slurm: Arc<dyn Slurm>,
        k8s: Arc<dyn Kubernetes>,
        k8s_settings: K8sSettings,
        storage: Arc<dyn Storage>,
        notifier: Option<Arc<dyn Notifier>>,
        authentik: Arc<dyn Authentik>,
        tenants: Arc<TenantRegistry>,
        timings: Timings,
        archive_dir: HostPath,
        login_address: String,
    ) -> Arc<Self> {
        Arc::new(Self {
            slurm,
            k8s,
            k8s_settings,
            storage,
            notifier,
            authentik,
            tenants,
            timings,
            archive_dir,
            command_timeout: Duration::from_secs(120),
            login_address,
        })
    }

    pub fn tenant(&self, name: &str) -> Result<&Tenant, Transition> {
        self.tenants
            .tenant(name)
            .ok_or_else(|| Transition::Fail(format!("tenant {name:?} is not in the tenant registry")))
    }

    /// The address the tenant's users SSH to: `login_address` with `{tenant}` filled in.
    pub fn login_address_of(&self, tenant: &TenantName) -> String {
        self.login_address.replace("{tenant}", tenant.as_str())
    }

    /// The tenant's names in Kubernetes, as the registry resolved them.
    pub fn k8s_names(&self, tenant: &TenantName) -> Result<&K8sNames, Transition> {
        Ok(&self.tenant(tenant.as_str())?.kubernetes)
    }

    /// The retry policy of the user and tenant flows' steps.
    pub fn policy(&self, max_attempts: u32) -> crate::engine::RetryPolicy {
        crate::engine::RetryPolicy {
            max_attempts,
            initial_delay: self.timings.retry_initial,
            max_delay: self.timings.retry_max,
            factor: 2.0,
            timeout: Duration::from_secs(600),
        }
    }

    /// The tenant's login pod.
    pub fn login(&self, names: &K8sNames) -> LoginPod {
        LoginPod::new(self.k8s.login(names), self.k8s_settings.clone(), self.command_timeout)
    }
}

/// A backend error as the engine's transition: retryable errors retry, the rest fail the job.
pub trait IntoTransition {
    fn transition(self, what: &str) -> Transition;
}

fn classify(retry: bool, msg: String) -> Transition {
    if retry { Transition::Retry(msg) } else { Transition::Fail(msg) }
}

/// As [`classify`], and a retry the far side said when to make (a 429's Retry-After) is not
/// made sooner.
fn classify_after(retry: bool, after: Option<Duration>, msg: String) -> Transition {
    match after {
        Some(after) if retry => Transition::RetryNotBefore(msg, after),
        _ => classify(retry, msg),
    }
}

impl IntoTransition for SlurmError {
    fn transition(self, what: &str) -> Transition {
        classify_after(self.is_retryable(), self.retry_after(), format!("{what}: {self}"))
    }
}
impl IntoTransition for K8sError {
    fn transition(self, what: &str) -> Transition {
        classify_after(self.is_retryable(), self.retry_after(), format!("{what}: {self}"))
    }
}
impl IntoTransition for LoginError {
    fn transition(self, what: &str) -> Transition {
        classify_after(self.is_retryable(), self.retry_after(), format!("{what}: {self}"))
    }
}
impl IntoTransition for StorageError {
    fn transition(self, what: &str) -> Transition {
        classify_after(self.is_retryable(), self.retry_after(), format!("{what}: {self}"))
    }
}
impl IntoTransition for crate::engine::EngineError {
    fn transition(self, what: &str) -> Transition {
        Transition::Retry(format!("{what}: {self}"))
    }
}
impl IntoTransition for AuthentikError {
    fn transition(self, what: &str) -> Transition {
        classify(self.is_transient(), format!("{what}: {self}"))
    }
}

/// `?` for steps: `b.slurm.user(&n.user).await.step("read the user back")?` ends the step's run
/// with the error's transition (retry or fail).
pub trait StepError<T> {
    fn step(self, what: &str) -> Result<T, Transition>;
}

impl<T, E: IntoTransition> StepError<T> for Result<T, E> {
    fn step(self, what: &str) -> Result<T, Transition> {
        self.map_err(|e| e.transition(what))
    }
}

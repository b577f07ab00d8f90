//! The backends' and flows' settings as flags, each with an environment variable and a default;
//! each converts into the plain settings type its part defines.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::settings::SlurmArgs;
use crate::backends::storage::{Backend, RunIn};
use crate::domain::{duration::parse_duration, secret::Secret};

/// What the flows act on: the settings `serve` and plans share.
#[derive(Clone, Debug, Args)]
pub struct BackendArgs {
    #[command(flatten, next_help_heading = "Kubernetes")]
    pub k8s: K8sArgs,
    #[command(flatten, next_help_heading = "Storage")]
    pub storage: StorageArgs,
    #[command(flatten, next_help_heading = "Notifications")]
    pub notify: NotifyArgs,
    #[command(flatten, next_help_heading = "Slurm")]
    pub slurm: SlurmArgs,
    #[command(flatten, next_help_heading = "Flows")]
    pub flows: FlowArgs,
}

#[derive(Clone, Debug, Args)]
pub struct K8sArgs {
    /// Kubeconfig file; without it, the in-cluster service account (or ~/.kube/config).
    #[arg(long, env = "ONRAMP_KUBECONFIG", value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the file's current context).
    #[arg(long, env = "ONRAMP_K8S_CONTEXT")]
    pub k8s_context: Option<String>,
    /// Longest wait for one Kubernetes API request.
    #[arg(long, env = "ONRAMP_K8S_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub k8s_timeout: Duration,
    /// Namespace of the Slurm control plane (slurmctld); also allowed in tenant NetworkPolicies.
    #[arg(long, env = "ONRAMP_SLURM_NAMESPACE", default_value = "slurm-control")]
    pub slurm_namespace: String,
    /// Deployment whose Ready pod runs Slurm commands (`kubectl exec deploy/slurmctld`).
    #[arg(long, env = "ONRAMP_SLURMCTLD_DEPLOYMENT", default_value = "slurmctld")]
    pub slurmctld_deployment: String,
    /// Container in the slurmctld pod (default: the pod's only or default container).
    #[arg(long, env = "ONRAMP_SLURMCTLD_CONTAINER")]
    pub slurmctld_container: Option<String>,
    /// Directory holding home directories in the login pod.
    #[arg(long, env = "ONRAMP_HOME_ROOT", default_value = "/home")]
    pub home_root: String,
    /// Skeleton copied into new home directories.
    #[arg(long, env = "ONRAMP_SKEL_DIR", default_value = "/etc/skel")]
    pub skel_dir: String,
    /// Where the login pod's sshd finds each user's keys (the Secret projected as files).
    #[arg(long, env = "ONRAMP_AUTHORIZED_KEYS_DIR", default_value = "/etc/ssh/authorized_keys.d")]
    pub authorized_keys_dir: String,
    /// How the smoke test becomes the user: an argv prefix, split on spaces, `{user}` replaced.
    #[arg(long, env = "ONRAMP_LOGIN_RUN_AS", default_value = "sudo -u {user} -i")]
    pub login_run_as: String,
    /// `--gres` for the smoke test's `sbatch --test-only`; empty to leave it out (CPU-only).
    #[arg(long, env = "ONRAMP_SMOKE_GRES", default_value = "gpu:1")]
    pub smoke_gres: String,
    /// Write users' keys into the tenant Secret (server-side apply) instead of only reading it.
    #[arg(long, env = "ONRAMP_MANAGE_KEYS", default_value_t = false)]
    pub manage_keys: bool,
    /// The tenant's Slurm cluster custom resource: group/version/plural.
    #[arg(long, env = "ONRAMP_SLURM_CLUSTER_RESOURCE", default_value = "slurm.nebius.ai/v1/slurmclusters")]
    pub slurm_cluster_resource: String,
    /// The tenant's Reservation custom resource: group/version/plural.
    #[arg(long, env = "ONRAMP_RESERVATION_RESOURCE", default_value = "slurm.nebius.ai/v1/reservations")]
    pub reservation_resource: String,
    /// The operator's NodeSet custom resource (checked gone after the SlurmCluster): group/version/plural.
    #[arg(long, env = "ONRAMP_NODESET_RESOURCE", default_value = "slurm.nebius.ai/v1alpha1/nodesets")]
    pub nodeset_resource: String,
}

#[derive(Clone, Debug, Args)]
pub struct StorageArgs {
    /// Which filesystem CLI sets quotas and takes snapshots.
    #[arg(long, env = "ONRAMP_STORAGE_BACKEND", default_value = "weka")]
    pub storage_backend: Backend,
    /// Path of a user's home on the filesystem; `{user}` replaced.
    #[arg(long, env = "ONRAMP_STORAGE_HOME_PATH", default_value = "/home/{user}")]
    pub storage_home_path: String,
    /// Path of a tenant's scratch space; `{tenant}` replaced.
    #[arg(long, env = "ONRAMP_STORAGE_SCRATCH_PATH", default_value = "/tenant/{tenant}/scratch")]
    pub storage_scratch_path: String,
    /// Filesystem holding homes (Weka filesystem or Lustre fsname), for snapshots.
    #[arg(long, env = "ONRAMP_STORAGE_HOME_FS", default_value = "home")]
    pub storage_home_fs: String,
    /// Filesystem holding scratch, for snapshots.
    #[arg(long, env = "ONRAMP_STORAGE_SCRATCH_FS", default_value = "scratch")]
    pub storage_scratch_fs: String,
    /// The weka CLI.
    #[arg(long, env = "ONRAMP_WEKA_BIN", default_value = "weka")]
    pub weka_bin: String,
    /// The lfs CLI.
    #[arg(long, env = "ONRAMP_LFS_BIN", default_value = "lfs")]
    pub lfs_bin: String,
    /// The lctl CLI (Lustre snapshots).
    #[arg(long, env = "ONRAMP_LCTL_BIN", default_value = "lctl")]
    pub lctl_bin: String,
    /// Lustre mount point for user quotas (`lfs setquota -u`).
    #[arg(long, env = "ONRAMP_LUSTRE_HOME_MOUNT", default_value = "/home")]
    pub lustre_home_mount: String,
    /// Lustre mount point for tenant quotas (`lfs setquota -g <tenant>`).
    #[arg(long, env = "ONRAMP_LUSTRE_SCRATCH_MOUNT", default_value = "/scratch")]
    pub lustre_scratch_mount: String,
    /// Quota argv template for the command backend, e.g. `setquota --path {path} --hard {hard_bytes}`.
    #[arg(long, env = "ONRAMP_STORAGE_QUOTA_COMMAND")]
    pub storage_quota_command: Option<String>,
    /// Snapshot argv template for the command backend, e.g. `snap create {fs} {name}`.
    #[arg(long, env = "ONRAMP_STORAGE_SNAPSHOT_COMMAND")]
    pub storage_snapshot_command: Option<String>,
    /// Text in a failed snapshot's output meaning "that name exists already".
    #[arg(long, env = "ONRAMP_STORAGE_EXISTS_PATTERN", default_value = "already exists")]
    pub storage_exists_pattern: String,
    /// Where the filesystem CLI runs: `local`, `pod/<namespace>/<pod>` or
    /// `deploy/<namespace>/<deployment>` (a Ready pod of it, through the Kubernetes exec API).
    #[arg(long, env = "ONRAMP_STORAGE_RUN_IN", default_value = "local")]
    pub storage_run_in: RunIn,
    /// Longest wait for one storage command.
    #[arg(long, env = "ONRAMP_STORAGE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub storage_timeout: Duration,
    /// Storage commands one process runs at once (the others wait their turn).
    #[arg(long, env = "ONRAMP_STORAGE_CONCURRENCY", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub storage_concurrency: u16,
}

#[derive(Clone, Debug, Args)]
pub struct NotifyArgs {
    /// Slack-compatible incoming webhook URL; unset = no Slack messages.
    #[arg(long, env = "ONRAMP_SLACK_WEBHOOK_URL", hide_env_values = true, value_name = "URL")]
    pub slack_webhook_url: Option<Secret>,
    /// SMTP server, e.g. smtps://user:pass@mail.example.org or smtp://127.0.0.1:2525; unset = no e-mail.
    #[arg(long, env = "ONRAMP_SMTP_URL", hide_env_values = true, value_name = "URL")]
    pub smtp_url: Option<Secret>,
    /// Sender of e-mails.
    #[arg(long, env = "ONRAMP_MAIL_FROM", default_value = "onramp <onramp@localhost>")]
    pub mail_from: String,
    /// Address users SSH to; `{tenant}` replaced.
    #[arg(long, env = "ONRAMP_LOGIN_ADDRESS", default_value = "login.{tenant}.cluster.example")]
    pub login_address: String,
    /// Longest wait for one notification.
    #[arg(long, env = "ONRAMP_NOTIFY_TIMEOUT", default_value = "20s", value_parser = parse_duration)]
    pub notify_timeout: Duration,
}

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
    /// How long the operator may take to remove a deleted SlurmCluster's NodeSets, pods and Secrets.
    #[arg(long, env = "ONRAMP_CLEANUP_DEADLINE", default_value = "10m", value_parser = parse_duration)]
    pub cleanup_deadline: Duration,
    /// How long a departed user's data is kept before the snapshot, archive and deletion.
    #[arg(long, env = "ONRAMP_RETENTION", default_value = "30d", value_parser = parse_duration)]
    pub retention: Duration,
    /// Where `sacctmgr archive dump` writes, on the slurmctld host.
    #[arg(long, env = "ONRAMP_ARCHIVE_DIR", default_value = "/var/spool/slurm/archive")]
    pub archive_dir: String,
    /// Attempts of a user or tenant flow's step before its job fails and waits for a person.
    #[arg(long, env = "ONRAMP_RETRY_ATTEMPTS", default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub retry_attempts: u32,
    /// Delay before a failed step's first retry; it doubles per attempt, up to `--retry-max`.
    #[arg(long, env = "ONRAMP_RETRY_INITIAL", default_value = "2s", value_parser = parse_duration)]
    pub retry_initial: Duration,
    /// The longest delay between two attempts of a failed step (a 429's Retry-After included).
    #[arg(long, env = "ONRAMP_RETRY_MAX", default_value = "2m", value_parser = parse_duration)]
    pub retry_max: Duration,
}

impl From<K8sArgs> for crate::backends::kubernetes::K8sSettings {
    fn from(a: K8sArgs) -> Self {
        Self {
            kubeconfig: a.kubeconfig,
            k8s_context: a.k8s_context,
            k8s_timeout: a.k8s_timeout,
            slurm_namespace: a.slurm_namespace,
            slurmctld_deployment: a.slurmctld_deployment,
            slurmctld_container: a.slurmctld_container,
            home_root: a.home_root,
            skel_dir: a.skel_dir,
            authorized_keys_dir: a.authorized_keys_dir,
            login_run_as: a.login_run_as,
            smoke_gres: a.smoke_gres,
            manage_keys: a.manage_keys,
            slurm_cluster_resource: a.slurm_cluster_resource,
            reservation_resource: a.reservation_resource,
            nodeset_resource: a.nodeset_resource,
        }
    }
}

impl From<StorageArgs> for crate::backends::storage::StorageSettings {
    fn from(a: StorageArgs) -> Self {
        Self {
            storage_backend: a.storage_backend,
            storage_home_path: a.storage_home_path,
            storage_scratch_path: a.storage_scratch_path,
            storage_home_fs: a.storage_home_fs,
            storage_scratch_fs: a.storage_scratch_fs,
            weka_bin: a.weka_bin,
            lfs_bin: a.lfs_bin,
            lctl_bin: a.lctl_bin,
            lustre_home_mount: a.lustre_home_mount,
            lustre_scratch_mount: a.lustre_scratch_mount,
            storage_quota_command: a.storage_quota_command,
            storage_snapshot_command: a.storage_snapshot_command,
            storage_exists_pattern: a.storage_exists_pattern,
            storage_run_in: a.storage_run_in,
            storage_timeout: a.storage_timeout,
            storage_concurrency: a.storage_concurrency,
        }
    }
}

impl From<NotifyArgs> for crate::backends::notify::NotifySettings {
    fn from(a: NotifyArgs) -> Self {
        Self {
            slack_webhook_url: a.slack_webhook_url,
            smtp_url: a.smtp_url,
            mail_from: a.mail_from,
            login_address: a.login_address,
            notify_timeout: a.notify_timeout,
        }
    }
}

impl From<FlowArgs> for crate::flows::settings::FlowSettings {
    fn from(a: FlowArgs) -> Self {
        Self {
            propagation_wait: a.propagation_wait,
            key_deadline: a.key_deadline,
            drain_deadline: a.drain_deadline,
            cleanup_deadline: a.cleanup_deadline,
            retention: a.retention,
            archive_dir: a.archive_dir,
            retry_attempts: a.retry_attempts,
            retry_initial: a.retry_initial,
            retry_max: a.retry_max,
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct All {
        #[command(flatten)]
        k8s: K8sArgs,
        #[command(flatten)]
        storage: StorageArgs,
        #[command(flatten)]
        notify: NotifyArgs,
        #[command(flatten)]
        flows: FlowArgs,
    }

    /// The plain settings' `Default` is what `--help` promises.
    #[test]
    fn flag_defaults_are_the_settings_defaults() {
        let a = All::try_parse_from(["onramp"]).unwrap();
        assert_eq!(crate::backends::kubernetes::K8sSettings::from(a.k8s), Default::default());
        assert_eq!(crate::backends::storage::StorageSettings::from(a.storage), Default::default());
        assert_eq!(crate::backends::notify::NotifySettings::from(a.notify), Default::default());
        assert_eq!(crate::flows::settings::FlowSettings::from(a.flows), Default::default());
    }
}

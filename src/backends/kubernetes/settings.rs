//! Kubernetes settings: each a flag with an environment variable and a default.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::domain::duration::parse_duration;

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
    /// Login pod in each tenant namespace that onramp execs into.
    #[arg(long, env = "ONRAMP_LOGIN_POD", default_value = "login-0")]
    pub login_pod: String,
    /// Container in the login pod (default: the pod's only or default container).
    #[arg(long, env = "ONRAMP_LOGIN_CONTAINER")]
    pub login_container: Option<String>,
    /// Login Deployment restarted when a key does not reach the pod.
    #[arg(long, env = "ONRAMP_LOGIN_DEPLOYMENT", default_value = "login")]
    pub login_deployment: String,
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
    /// Name of a tenant's Slurm cluster resource in its namespace; `{tenant}` replaced.
    #[arg(long, env = "ONRAMP_SLURM_CLUSTER_NAME", default_value = "cluster-{tenant}")]
    pub slurm_cluster_name: String,
    /// The tenant's Reservation custom resource: group/version/plural.
    #[arg(long, env = "ONRAMP_RESERVATION_RESOURCE", default_value = "slurm.nebius.ai/v1/reservations")]
    pub reservation_resource: String,
    /// Name of a tenant's Reservation; `{tenant}` replaced.
    #[arg(long, env = "ONRAMP_RESERVATION_NAME", default_value = "{tenant}-reservation")]
    pub reservation_name: String,
    /// Namespace of Reservations; empty = the tenant's namespace; `-` = cluster-scoped.
    #[arg(long, env = "ONRAMP_RESERVATION_NAMESPACE", default_value = "")]
    pub reservation_namespace: String,
}

impl K8sArgs {
    /// The defaults, as `--help` shows them.
    pub fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: K8sArgs,
        }
        <P as clap::Parser>::parse_from(["onramp"]).a
    }
}

/// `group/version/plural` of a custom resource, from configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourcePath {
    pub group: String,
    pub version: String,
    pub plural: String,
}

impl std::str::FromStr for ResourcePath {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &str| !p.is_empty() && p.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-');
        match parts.as_slice() {
            [g, v, p] if ok(g) && ok(v) && ok(p) => {
                Ok(Self { group: (*g).into(), version: (*v).into(), plural: (*p).into() })
            }
            _ => Err(format!("{s:?} is not group/version/plural, e.g. slurm.nebius.ai/v1/slurmclusters")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_resource_paths() {
        let d = K8sArgs::defaults();
        assert_eq!(d.slurmctld_deployment, "slurmctld");
        assert_eq!(d.k8s_timeout, Duration::from_secs(30));
        let r: ResourcePath = d.slurm_cluster_resource.parse().unwrap();
        assert_eq!((r.group.as_str(), r.plural.as_str()), ("slurm.nebius.ai", "slurmclusters"));
        assert!("v1/x".parse::<ResourcePath>().is_err());
        assert!("a/b/c d".parse::<ResourcePath>().is_err());
    }
}

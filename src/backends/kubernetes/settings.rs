//! Kubernetes settings, plain values; `app::cli` parses them from flags and the environment.

use std::path::PathBuf;
use std::time::Duration;

/// Kubernetes: where Slurm is, the tenants' custom resources, the login pods' paths. Each tenant's
/// names (namespace, key Secret, login pod, custom resources, node label) are in the tenant
/// registry (`domain::tenants::K8sNames`).
#[derive(Clone, Debug, PartialEq)]
pub struct K8sSettings {
    /// Kubeconfig file; without it, the in-cluster service account (or ~/.kube/config).
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context to use (default: the file's current context).
    pub k8s_context: Option<String>,
    /// Longest wait for one Kubernetes API request.
    pub k8s_timeout: Duration,
    /// Namespace of the Slurm control plane (slurmctld); also allowed in tenant NetworkPolicies.
    pub slurm_namespace: String,
    /// Deployment whose Ready pod runs Slurm commands (`kubectl exec deploy/slurmctld`).
    pub slurmctld_deployment: String,
    /// Container in the slurmctld pod (default: the pod's only or default container).
    pub slurmctld_container: Option<String>,
    /// Directory holding home directories in the login pod.
    pub home_root: String,
    /// Skeleton copied into new home directories.
    pub skel_dir: String,
    /// Where the login pod's sshd finds each user's keys (the Secret projected as files).
    pub authorized_keys_dir: String,
    /// How the smoke test becomes the user: an argv prefix, split on spaces, `{user}` replaced.
    pub login_run_as: String,
    /// `--gres` for the smoke test's `sbatch --test-only`; empty to leave it out (CPU-only).
    pub smoke_gres: String,
    /// Write users' keys into the tenant Secret (server-side apply) instead of only reading it.
    pub manage_keys: bool,
    /// The tenant's Slurm cluster custom resource: group/version/plural.
    pub slurm_cluster_resource: String,
    /// The tenant's Reservation custom resource: group/version/plural.
    pub reservation_resource: String,
    /// The operator's NodeSet custom resource (checked gone after the SlurmCluster): group/version/plural.
    pub nodeset_resource: String,
}

impl Default for K8sSettings {
    /// The defaults `--help` shows (a test in `app::cli` keeps them equal).
    fn default() -> Self {
        Self {
            kubeconfig: Default::default(),
            k8s_context: Default::default(),
            k8s_timeout: Duration::from_secs(30),
            slurm_namespace: "slurm-control".into(),
            slurmctld_deployment: "slurmctld".into(),
            slurmctld_container: Default::default(),
            home_root: "/home".into(),
            skel_dir: "/etc/skel".into(),
            authorized_keys_dir: "/etc/ssh/authorized_keys.d".into(),
            login_run_as: "sudo -u {user} -i".into(),
            smoke_gres: "gpu:1".into(),
            manage_keys: false,
            slurm_cluster_resource: "slurm.nebius.ai/v1/slurmclusters".into(),
            reservation_resource: "slurm.nebius.ai/v1/reservations".into(),
            nodeset_resource: "slurm.nebius.ai/v1alpha1/nodesets".into(),
        }
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
        let d = K8sSettings::default();
        assert_eq!(d.slurmctld_deployment, "slurmctld");
        assert_eq!(d.k8s_timeout, Duration::from_secs(30));
        let r: ResourcePath = d.slurm_cluster_resource.parse().unwrap();
        assert_eq!((r.group.as_str(), r.plural.as_str()), ("slurm.nebius.ai", "slurmclusters"));
        assert!("v1/x".parse::<ResourcePath>().is_err());
        assert!("a/b/c d".parse::<ResourcePath>().is_err());
    }
}

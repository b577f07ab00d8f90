//! The one route to Slurm's commands (`ONRAMP_SLURM_VIA`): every Slurm call of this process —
//! the flows' reads and writes, the reconciler's, `doctor`'s — goes through the transport built
//! here. Checked once at start: a route that cannot work stops the process with one line naming
//! the setting and the fix, never a retry loop.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::app::cli::{SlurmArgs, SlurmVia};
use crate::backends::exec::{Local, Transport, TransportError};
use crate::backends::kubernetes::{K8sSettings, Kubernetes};
use crate::backends::slurm::{Slurm, SlurmError};
use crate::backends::ssh::{Ssh, SshSettings};
use crate::domain::names::ClusterName;

/// Where Slurm's commands run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlurmRoute {
    /// In a Ready pod of the slurmctld Deployment, through the Kubernetes exec API.
    KubeExec,
    /// On this host.
    Local,
    /// On a controller host, over OpenSSH.
    Ssh(SshSettings),
}

impl SlurmRoute {
    /// The route the settings name, its parts checked (files readable, the host key pinned).
    pub fn from_args(a: &SlurmArgs) -> anyhow::Result<Self> {
        let ssh_set = [
            ("ONRAMP_SLURM_SSH_HOST", a.slurm_ssh_host.is_some()),
            ("ONRAMP_SLURM_SSH_USER", a.slurm_ssh_user.is_some()),
            ("ONRAMP_SLURM_SSH_KEY_FILE", a.slurm_ssh_key_file.is_some()),
            ("ONRAMP_SLURM_SSH_KNOWN_HOSTS", a.slurm_ssh_known_hosts.is_some()),
        ];
        match a.slurm_via {
            SlurmVia::KubeExec | SlurmVia::Local => {
                if let Some((name, _)) = ssh_set.iter().find(|(_, set)| *set) {
                    let via = if a.slurm_via == SlurmVia::Local { "local" } else { "kube-exec" };
                    bail!("{name} is set but ONRAMP_SLURM_VIA={via}: set ONRAMP_SLURM_VIA=ssh to use it, or unset it");
                }
                Ok(if a.slurm_via == SlurmVia::Local { Self::Local } else { Self::KubeExec })
            }
            SlurmVia::Ssh => {
                let host = a.slurm_ssh_host.clone().filter(|h| !h.trim().is_empty()).ok_or_else(|| {
                    anyhow::anyhow!("ONRAMP_SLURM_VIA=ssh needs ONRAMP_SLURM_SSH_HOST (the Slurm controller host)")
                })?;
                if host.starts_with('-') || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    bail!("ONRAMP_SLURM_SSH_HOST {host:?} is not a host name or address");
                }
                let key_file = need_file(&a.slurm_ssh_key_file, "ONRAMP_SLURM_SSH_KEY_FILE", "the private key")?;
                check_key_mode(&key_file)?;
                let known_hosts =
                    need_file(&a.slurm_ssh_known_hosts, "ONRAMP_SLURM_SSH_KNOWN_HOSTS", "the controller's host key")?;
                check_known_host(&known_hosts, &host, a.slurm_ssh_port)?;
                Ok(Self::Ssh(SshSettings {
                    host,
                    user: a.slurm_ssh_user.clone(),
                    port: a.slurm_ssh_port,
                    key_file,
                    known_hosts,
                    connect_timeout: Duration::from_secs(10).min(a.slurm_timeout),
                }))
            }
        }
    }

    /// The transport; `kube` is needed (and used) only by `kube-exec`.
    pub fn transport(&self, kube: Option<&dyn Kubernetes>) -> anyhow::Result<Arc<dyn Transport>> {
        Ok(match self {
            Self::Local => Arc::new(Local),
            Self::Ssh(s) => Arc::new(Ssh::new(s.clone())),
            Self::KubeExec => {
                kube.ok_or_else(|| anyhow::anyhow!("ONRAMP_SLURM_VIA=kube-exec needs the Kubernetes API"))?.slurmctld()
            }
        })
    }

    /// For messages: the route and where it leads.
    pub fn describe(&self, k8s: &K8sSettings) -> String {
        match self {
            Self::KubeExec => format!(
                "ONRAMP_SLURM_VIA=kube-exec (deploy/{} in namespace {}: ONRAMP_SLURMCTLD_DEPLOYMENT, ONRAMP_SLURM_NAMESPACE)",
                k8s.slurmctld_deployment, k8s.slurm_namespace
            ),
            Self::Local => "ONRAMP_SLURM_VIA=local (Slurm's commands on this host's PATH)".into(),
            Self::Ssh(s) => format!(
                "ONRAMP_SLURM_VIA=ssh ({}{}:{}: ONRAMP_SLURM_SSH_*)",
                s.user.as_deref().map(|u| format!("{u}@")).unwrap_or_default(),
                s.host,
                s.port
            ),
        }
    }
}

fn need_file(p: &Option<PathBuf>, name: &str, what: &str) -> anyhow::Result<PathBuf> {
    let p = p.clone().ok_or_else(|| anyhow::anyhow!("ONRAMP_SLURM_VIA=ssh needs {name} ({what})"))?;
    std::fs::File::open(&p).with_context(|| format!("{name}: cannot read {}", p.display()))?;
    Ok(p)
}

/// OpenSSH refuses a private key of its own user that others can read; say so now rather than
/// at the first step. (A key owned by another user, e.g. root's from a Secret volume read
/// through `fsGroup` with mode 0440, is accepted by ssh and here.)
fn check_key_mode(p: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(p).with_context(|| format!("ONRAMP_SLURM_SSH_KEY_FILE: {}", p.display()))?;
    // /proc/self belongs to this process's effective user
    let me = std::fs::metadata("/proc/self").map(|m| m.uid()).ok();
    if Some(meta.uid()) == me && meta.mode() & 0o077 != 0 {
        bail!(
            "ONRAMP_SLURM_SSH_KEY_FILE {} is readable by others (mode {:o}); ssh refuses it: chmod 600 it",
            p.display(),
            meta.mode() & 0o777
        );
    }
    Ok(())
}

/// The controller's key must already be in the pinned file (StrictHostKeyChecking=yes).
fn check_known_host(file: &Path, host: &str, port: u16) -> anyhow::Result<()> {
    let name = if port == 22 { host.to_string() } else { format!("[{host}]:{port}") };
    let out = std::process::Command::new("ssh-keygen")
        .args(["-F", &name, "-f"])
        .arg(file)
        .output()
        .context("ONRAMP_SLURM_VIA=ssh needs the OpenSSH client (ssh, ssh-keygen) on PATH")?;
    if !out.status.success() {
        bail!(
            "ONRAMP_SLURM_SSH_KNOWN_HOSTS {} has no key for {name}: add it (ssh-keyscan -p {port} {host}, \
             checked against the controller's own key) — onramp trusts no other host key",
            file.display()
        );
    }
    Ok(())
}

/// Runs `scontrol show config` over the route: it answers, and for the cluster onramp manages.
pub async fn probe(slurm: &dyn Slurm, cluster: &ClusterName, route: &str) -> anyhow::Result<()> {
    let config = match slurm.config().await {
        Ok(c) => c,
        Err(SlurmError::Transport { source: TransportError::Spawn { program, reason }, .. }) => {
            bail!("Slurm is not reachable over {route}: cannot run {program}: {reason}")
        }
        Err(e) => bail!("Slurm is not reachable over {route}: {e}"),
    };
    match config.get("ClusterName") {
        Some(c) if c == cluster.as_str() => Ok(()),
        Some(c) => bail!(
            "over {route}, slurmctld serves cluster {c:?}, but ONRAMP_SLURM_CLUSTER is {:?}: set it to {c:?} \
             or point the route at the right controller",
            cluster.as_str()
        ),
        None => bail!("over {route}, `scontrol show config` named no ClusterName"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::cli::{Cli, Command};
    use clap::Parser;

    fn slurm_args(extra: &[&str]) -> SlurmArgs {
        let mut argv = vec!["onramp", "doctor"];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().command {
            Command::Doctor(d) => d.slurm,
            _ => unreachable!(),
        }
    }

    #[test]
    fn routes_and_their_mistakes() {
        assert_eq!(SlurmRoute::from_args(&slurm_args(&[])).unwrap(), SlurmRoute::KubeExec);
        assert_eq!(SlurmRoute::from_args(&slurm_args(&["--slurm-via", "local"])).unwrap(), SlurmRoute::Local);
        let e = SlurmRoute::from_args(&slurm_args(&["--slurm-ssh-host", "ctl"])).unwrap_err().to_string();
        assert!(e.contains("ONRAMP_SLURM_SSH_HOST is set but ONRAMP_SLURM_VIA=kube-exec"), "{e}");
        let e = SlurmRoute::from_args(&slurm_args(&["--slurm-via", "ssh"])).unwrap_err().to_string();
        assert!(e.contains("needs ONRAMP_SLURM_SSH_HOST"), "{e}");
        let e = SlurmRoute::from_args(&slurm_args(&["--slurm-via", "ssh", "--slurm-ssh-host", "ctl"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs ONRAMP_SLURM_SSH_KEY_FILE"), "{e}");
    }

    #[test]
    fn ssh_files_are_checked_before_anything_runs() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let key = dir.path().join("key");
        std::fs::write(&key, "not really a key\n").unwrap();
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let kh = dir.path().join("known_hosts");
        std::fs::write(
            &kh,
            "other.example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n",
        )
        .unwrap();
        let (k, h) = (key.to_str().unwrap(), kh.to_str().unwrap());
        let args = |extra: &[&str]| {
            let mut v = vec!["--slurm-via", "ssh", "--slurm-ssh-host", "ctl1.example.org", "--slurm-ssh-key-file", k];
            v.extend_from_slice(extra);
            slurm_args(&v)
        };
        let e = SlurmRoute::from_args(&args(&["--slurm-ssh-known-hosts", h])).unwrap_err().to_string();
        assert!(e.contains("readable by others") && e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = SlurmRoute::from_args(&args(&["--slurm-ssh-known-hosts", "/nonexistent/kh"])).unwrap_err();
        assert!(format!("{e:#}").contains("ONRAMP_SLURM_SSH_KNOWN_HOSTS: cannot read /nonexistent/kh"), "{e:#}");
        let e = SlurmRoute::from_args(&args(&["--slurm-ssh-known-hosts", h])).unwrap_err().to_string();
        assert!(e.contains("has no key for ctl1.example.org") && e.contains("ssh-keyscan"), "{e}");
        std::fs::write(
            &kh,
            "ctl1.example.org ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n",
        )
        .unwrap();
        let r = SlurmRoute::from_args(&args(&["--slurm-ssh-known-hosts", h])).unwrap();
        assert!(matches!(&r, SlurmRoute::Ssh(s) if s.host == "ctl1.example.org" && s.port == 22));
        let e = SlurmRoute::from_args(&args(&["--slurm-ssh-known-hosts", h, "--slurm-ssh-port", "2222"]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no key for [ctl1.example.org]:2222"), "{e}");
    }
}

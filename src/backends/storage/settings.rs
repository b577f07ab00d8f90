//! Storage settings: each a flag with an environment variable and a default.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{Dir, Quota, SnapshotName};
use crate::backends::kubernetes::exec::PodTarget;
use crate::domain::duration::parse_duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Weka,
    Lustre,
    /// Argv templates (`--storage-quota-command`, `--storage-snapshot-command`).
    Command,
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
}

/// Where storage commands run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunIn {
    Local,
    Pod { namespace: String, target: PodTarget },
}

impl std::str::FromStr for RunIn {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("{s:?} is not local, pod/<namespace>/<pod> or deploy/<namespace>/<deployment>");
        if s == "local" {
            return Ok(Self::Local);
        }
        let parts: Vec<&str> = s.split('/').collect();
        let ok = |p: &str| {
            !p.is_empty() && p.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        };
        match parts.as_slice() {
            [kind, ns, name] if ok(ns) && ok(name) => {
                let target = match *kind {
                    "pod" => PodTarget::Pod((*name).into()),
                    "deploy" | "deployment" => PodTarget::Deployment((*name).into()),
                    _ => return Err(bad()),
                };
                Ok(Self::Pod { namespace: (*ns).into(), target })
            }
            _ => Err(bad()),
        }
    }
}

impl RunIn {
    /// The transport for this setting; a pod needs a Kubernetes client.
    pub fn transport(
        &self,
        k8s: Option<&crate::backends::kubernetes::K8s>,
    ) -> Result<std::sync::Arc<dyn crate::backends::exec::Transport>, String> {
        match self {
            Self::Local => Ok(std::sync::Arc::new(crate::backends::exec::Local)),
            Self::Pod { namespace, target } => {
                let k8s = k8s.ok_or("--storage-run-in names a pod but Kubernetes is not configured")?;
                Ok(std::sync::Arc::new(crate::backends::kubernetes::exec::PodExec::new(
                    k8s.clone(),
                    namespace.clone(),
                    target.clone(),
                    None,
                )))
            }
        }
    }
}

impl StorageArgs {
    pub fn defaults() -> Self {
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: StorageArgs,
        }
        <P as clap::Parser>::parse_from(["onramp"]).a
    }

    pub fn path(&self, target: &Dir) -> String {
        match target {
            Dir::Home(u) => self.storage_home_path.replace("{user}", u.as_str()),
            Dir::Scratch(t) => self.storage_scratch_path.replace("{tenant}", t.as_str()),
        }
    }

    pub fn filesystem(&self, target: &Dir) -> String {
        match target {
            Dir::Home(_) => self.storage_home_fs.clone(),
            Dir::Scratch(_) => self.storage_scratch_fs.clone(),
        }
    }

    pub(super) fn vars(
        &self,
        target: &Dir,
        q: Option<Quota>,
        name: Option<&SnapshotName>,
    ) -> BTreeMap<&'static str, String> {
        let mut v = BTreeMap::from([("path", self.path(target)), ("fs", self.filesystem(target))]);
        match target {
            Dir::Home(u) => v.insert("user", u.to_string()),
            Dir::Scratch(t) => v.insert("tenant", t.to_string()),
        };
        if let Some(q) = q {
            v.insert("hard", q.hard().to_string());
            v.insert("soft", q.soft().to_string());
            v.insert("hard_bytes", q.hard().bytes().to_string());
            v.insert("soft_bytes", q.soft().bytes().to_string());
        }
        if let Some(n) = name {
            v.insert("name", n.as_str().into());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_in_parses() {
        assert_eq!("local".parse::<RunIn>(), Ok(RunIn::Local));
        assert_eq!(
            "deploy/weka-system/weka-cli".parse::<RunIn>(),
            Ok(RunIn::Pod { namespace: "weka-system".into(), target: PodTarget::Deployment("weka-cli".into()) })
        );
        assert!("pod/ns".parse::<RunIn>().is_err());
        assert!("vm/a/b".parse::<RunIn>().is_err());
        assert!(RunIn::Local.transport(None).is_ok());
        assert!("pod/a/b".parse::<RunIn>().unwrap().transport(None).is_err());
    }
}

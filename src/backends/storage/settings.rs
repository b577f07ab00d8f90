//! Storage settings, plain values; `app::cli` parses them from flags and the environment.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Dir, Place, Quota, SnapshotName};
use crate::backends::kubernetes::exec::PodTarget;

/// Which filesystem CLI: `weka`, `lustre`, or `command` (argv templates,
/// `--storage-quota-command` and `--storage-snapshot-command`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Weka,
    Lustre,
    Command,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "weka" => Ok(Self::Weka),
            "lustre" => Ok(Self::Lustre),
            "command" => Ok(Self::Command),
            _ => Err(format!("{s:?} is not weka, lustre or command")),
        }
    }
}

/// Storage: which filesystem CLI sets quotas and takes snapshots, where it runs.
#[derive(Clone, Debug, PartialEq)]
pub struct StorageSettings {
    /// Which filesystem CLI sets quotas and takes snapshots.
    pub storage_backend: Backend,
    /// Path of a user's home on the filesystem; `{user}` replaced.
    pub storage_home_path: String,
    /// Path of a tenant's scratch space; `{tenant}` replaced.
    pub storage_scratch_path: String,
    /// Filesystem holding homes (Weka filesystem or Lustre fsname), for snapshots.
    pub storage_home_fs: String,
    /// Filesystem holding scratch, for snapshots.
    pub storage_scratch_fs: String,
    /// The weka CLI.
    pub weka_bin: String,
    /// The lfs CLI.
    pub lfs_bin: String,
    /// The lctl CLI (Lustre snapshots).
    pub lctl_bin: String,
    /// Lustre mount point for user quotas (`lfs setquota -u`).
    pub lustre_home_mount: String,
    /// Lustre mount point for tenant quotas (`lfs setquota -g <tenant>`).
    pub lustre_scratch_mount: String,
    /// Quota argv template for the command backend, e.g. `setquota --path {path} --hard {hard_bytes}`.
    pub storage_quota_command: Option<String>,
    /// Snapshot argv template for the command backend, e.g. `snap create {fs} {name}`.
    pub storage_snapshot_command: Option<String>,
    /// Text in a failed snapshot's output meaning "that name exists already".
    pub storage_exists_pattern: String,
    /// Where the filesystem CLI runs: `local`, `pod/<namespace>/<pod>` or
    /// `deploy/<namespace>/<deployment>` (a Ready pod of it, through the Kubernetes exec API).
    pub storage_run_in: RunIn,
    /// Longest wait for one storage command.
    pub storage_timeout: Duration,
    /// Storage commands one process runs at once; the steps past it wait their turn (a class of
    /// a thousand onboardings would otherwise start a thousand CLIs against the filesystem).
    pub storage_concurrency: u16,
}

impl Default for StorageSettings {
    /// The defaults `--help` shows (a test in `app::cli` keeps them equal).
    fn default() -> Self {
        Self {
            storage_backend: "weka".parse().expect("a default"),
            storage_home_path: "/home/{user}".into(),
            storage_scratch_path: "/tenant/{tenant}/scratch".into(),
            storage_home_fs: "home".into(),
            storage_scratch_fs: "scratch".into(),
            weka_bin: "weka".into(),
            lfs_bin: "lfs".into(),
            lctl_bin: "lctl".into(),
            lustre_home_mount: "/home".into(),
            lustre_scratch_mount: "/scratch".into(),
            storage_quota_command: Default::default(),
            storage_snapshot_command: Default::default(),
            storage_exists_pattern: "already exists".into(),
            storage_run_in: "local".parse().expect("a default"),
            storage_timeout: Duration::from_secs(60),
            storage_concurrency: 8,
        }
    }
}

/// The path a storage command uses for a place, and where it came from (`registry` or `settings`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Located {
    pub path: String,
    pub from: &'static str,
}

impl StorageSettings {
    /// The path of `target`: the tenant registry's when it has one (it wins), else the settings'
    /// template. Lustre quotas are per user or group on a filesystem: there it is the filesystem
    /// argument (the registry's directory holding homes, or the tenant's scratch directory; else
    /// `--lustre-home-mount` / `--lustre-scratch-mount`).
    pub fn locate(&self, target: &Place) -> Located {
        let lustre = self.storage_backend == Backend::Lustre;
        let (path, from) = match (&target.dir, target.registry_path.as_deref()) {
            (Dir::Home(_), Some(root)) if lustre => (root.to_string(), "registry"),
            (Dir::Home(u), Some(root)) if root.contains("{user}") => (root.replace("{user}", u.as_str()), "registry"),
            (Dir::Home(u), Some(root)) => (format!("{}/{u}", root.trim_end_matches('/')), "registry"),
            (Dir::Scratch(t), Some(p)) => (p.replace("{tenant}", t.as_str()), "registry"),
            (Dir::Home(_), None) if lustre => (self.lustre_home_mount.clone(), "settings"),
            (Dir::Scratch(_), None) if lustre => (self.lustre_scratch_mount.clone(), "settings"),
            (Dir::Home(u), None) => (self.storage_home_path.replace("{user}", u.as_str()), "settings"),
            (Dir::Scratch(t), None) => (self.storage_scratch_path.replace("{tenant}", t.as_str()), "settings"),
        };
        Located { path, from }
    }

    pub fn filesystem(&self, target: &Dir) -> String {
        match target {
            Dir::Home(_) => self.storage_home_fs.clone(),
            Dir::Scratch(_) => self.storage_scratch_fs.clone(),
        }
    }

    pub(super) fn vars(
        &self,
        target: &Place,
        q: Option<Quota>,
        name: Option<&SnapshotName>,
    ) -> BTreeMap<&'static str, String> {
        let mut v = BTreeMap::from([("path", self.locate(target).path), ("fs", self.filesystem(&target.dir))]);
        match &target.dir {
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

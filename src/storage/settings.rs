//! Storage settings: each a flag with an environment variable and a default.

use std::collections::BTreeMap;
use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{Quota, SnapshotName, Target};
use crate::config::parse_duration;

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
    #[arg(
        long,
        env = "ONRAMP_STORAGE_SCRATCH_PATH",
        default_value = "/tenant/{tenant}/scratch"
    )]
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
    #[arg(
        long,
        env = "ONRAMP_STORAGE_EXISTS_PATTERN",
        default_value = "already exists"
    )]
    pub storage_exists_pattern: String,
    /// Longest wait for one storage command.
    #[arg(long, env = "ONRAMP_STORAGE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub storage_timeout: Duration,
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

    pub fn path(&self, target: &Target) -> String {
        match target {
            Target::Home(u) => self.storage_home_path.replace("{user}", u.as_str()),
            Target::Scratch(t) => self.storage_scratch_path.replace("{tenant}", t.as_str()),
        }
    }

    pub fn filesystem(&self, target: &Target) -> String {
        match target {
            Target::Home(_) => self.storage_home_fs.clone(),
            Target::Scratch(_) => self.storage_scratch_fs.clone(),
        }
    }

    pub(super) fn vars(
        &self,
        target: &Target,
        q: Option<Quota>,
        name: Option<&SnapshotName>,
    ) -> BTreeMap<&'static str, String> {
        let mut v = BTreeMap::from([("path", self.path(target)), ("fs", self.filesystem(target))]);
        match target {
            Target::Home(u) => v.insert("user", u.to_string()),
            Target::Scratch(t) => v.insert("tenant", t.to_string()),
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

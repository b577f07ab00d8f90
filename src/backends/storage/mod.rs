//! Storage quotas and snapshots behind one trait, [`Storage`]. The real implementation,
//! [`CommandStorage`], runs a filesystem's own CLI through a configured [`Transport`]:
//! Weka (`weka fs quota set`, `weka fs snapshot create`), Lustre (`lfs setquota`,
//! `lctl snapshot_create`), or argv templates for anything else. Both operations are
//! idempotent: a quota is set to the same value again without harm, and a snapshot whose name
//! already exists is reported as [`Snapshot::Exists`]. A quota is read back with the CLI's list
//! command ([`readback`]).
//!
//! Paths: a [`Place`] carries the tenant registry's `quotas.home.path` / `quotas.scratch.path`
//! when the tenant has one; it wins over the settings' `--storage-home-path` /
//! `--storage-scratch-path` templates, which are the default ([`StorageSettings::locate`]).

pub mod readback;
pub mod settings;
pub mod size;
mod template;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

pub use readback::Limits;
pub use settings::{Backend, Located, RunIn, StorageSettings};
pub use size::{Quota, Size, SizeError};
pub use template::Template;

use crate::backends::exec::{Command, Transport, TransportError};
use crate::domain::names::{TenantName, Username};

/// Whose space a quota or snapshot is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dir {
    /// `$HOME` of a user.
    Home(Username),
    /// A tenant's scratch space.
    Scratch(TenantName),
}

/// Whose space, and the tenant registry's path for it when the tenant has one: for a home, the
/// directory holding homes (`/home`; `{user}` in it is replaced, else the user's name is
/// appended); for scratch, the tenant's directory (`{tenant}` replaced).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub dir: Dir,
    pub registry_path: Option<String>,
}

impl From<Dir> for Place {
    fn from(dir: Dir) -> Self {
        Self { dir, registry_path: None }
    }
}

impl Dir {
    /// This space at the registry's path (`None`: the settings' template).
    pub fn at(self, registry_path: Option<&str>) -> Place {
        Place { dir: self, registry_path: registry_path.map(String::from) }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snapshot {
    Created,
    Exists,
}

/// A snapshot name: same rules as other names (`offboard-alice-20261130`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotName(String);

impl SnapshotName {
    pub fn parse(s: &str) -> Result<Self, crate::domain::names::NameError> {
        // Reuse the account-name rules: lower-case letters, digits, `-`, `_`, no leading `-`.
        crate::domain::names::SlurmAccount::parse(s).map(|a| Self(a.to_string()))
    }
    /// `offboard-<user>-<YYYYMMDD>`, the runbook's name for a departing user's `$HOME`.
    pub fn offboard(user: &Username, date: time::Date) -> Self {
        Self(format!("offboard-{user}-{:04}{:02}{:02}", date.year(), u8::from(date.month()), date.day()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("storage: {0}")]
    Transport(#[from] TransportError),
    #[error("storage: `{command}` exited with {code}: {message}")]
    Failed { command: String, code: i32, message: String },
    #[error("storage: {0}")]
    Unsupported(String),
}

impl StorageError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Transport(t) if t.is_transient())
    }

    /// How long the far side asked to wait before the next try (a 429 on the exec).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Transport(t) => t.retry_after(),
            _ => None,
        }
    }
}

pub type StorageFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, StorageError>> + Send + 'a>>;

/// Quotas and snapshots on the cluster's filesystems.
pub trait Storage: Send + Sync {
    fn set_quota<'a>(&'a self, target: &'a Place, quota: Quota) -> StorageFuture<'a, ()>;
    fn snapshot<'a>(&'a self, target: &'a Place, name: &'a SnapshotName) -> StorageFuture<'a, Snapshot>;
    /// The quota the filesystem reports for `target` (`None`: none is set).
    fn quota<'a>(&'a self, target: &'a Place) -> StorageFuture<'a, Option<Limits>>;
    /// The path (or Lustre filesystem) the commands for `target` use, and where it came from.
    fn locate(&self, target: &Place) -> Located;
}

/// Runs the configured backend's commands through a transport.
#[derive(Clone)]
pub struct CommandStorage {
    transport: Arc<dyn Transport>,
    settings: StorageSettings,
    /// One permit per command running (`--storage-concurrency`).
    running: Arc<tokio::sync::Semaphore>,
}

impl CommandStorage {
    /// Checks the settings (templates, backend) once, up front.
    pub fn new(transport: Arc<dyn Transport>, settings: StorageSettings) -> Result<Self, StorageError> {
        for t in [&settings.storage_quota_command, &settings.storage_snapshot_command].into_iter().flatten() {
            Template::parse(t).map_err(StorageError::Unsupported)?;
        }
        let running = Arc::new(tokio::sync::Semaphore::new(usize::from(settings.storage_concurrency.max(1))));
        Ok(Self { transport, settings, running })
    }

    /// The command that sets `quota` on `target`.
    pub fn quota_command(&self, target: &Place, quota: Quota) -> Result<Command, StorageError> {
        let s = &self.settings;
        let (hard, soft) = (quota.hard(), quota.soft());
        Ok(match s.storage_backend {
            Backend::Weka => Command::new(&s.weka_bin).args(["fs", "quota", "set"]).arg(s.locate(target).path).args([
                "--hard".to_string(),
                hard.to_string(),
                "--soft".into(),
                soft.to_string(),
            ]),
            Backend::Lustre => {
                let (flag, who) = lustre_owner(&target.dir);
                Command::new(&s.lfs_bin).arg("setquota").args([flag.to_string(), who]).args([
                    "-b".to_string(),
                    soft.kib().to_string(),
                    "-B".into(),
                    hard.kib().to_string(),
                    s.locate(target).path,
                ])
            }
            Backend::Command => {
                let t = s.storage_quota_command.as_deref().ok_or_else(|| missing("--storage-quota-command"))?;
                let vars = s.vars(target, Some(quota), None);
                Template::parse(t).map_err(StorageError::Unsupported)?.render(&vars)
            }
        })
    }

    /// The command that reads `target`'s quota back (`None`: the command backend has none).
    pub fn quota_read_command(&self, target: &Place) -> Option<Command> {
        let s = &self.settings;
        match s.storage_backend {
            Backend::Weka => Some(
                Command::new(&s.weka_bin)
                    .args(["fs", "quota", "list"])
                    .arg(s.filesystem(&target.dir))
                    .arg("--path")
                    .arg(s.locate(target).path)
                    .args(["--all", "-J"]),
            ),
            Backend::Lustre => {
                let (flag, who) = lustre_owner(&target.dir);
                Some(Command::new(&s.lfs_bin).arg("quota").args([flag.to_string(), who, s.locate(target).path]))
            }
            Backend::Command => None,
        }
    }

    /// The command that snapshots `target` as `name`.
    pub fn snapshot_command(&self, target: &Place, name: &SnapshotName) -> Result<Command, StorageError> {
        let s = &self.settings;
        Ok(match s.storage_backend {
            Backend::Weka => Command::new(&s.weka_bin)
                .args(["fs", "snapshot", "create"])
                .args([s.filesystem(&target.dir), name.as_str().into()]),
            Backend::Lustre => Command::new(&s.lctl_bin).arg("snapshot_create").args([
                "-F".to_string(),
                s.filesystem(&target.dir),
                "-n".into(),
                name.as_str().into(),
            ]),
            Backend::Command => {
                let t = s.storage_snapshot_command.as_deref().ok_or_else(|| missing("--storage-snapshot-command"))?;
                let vars = s.vars(target, None, Some(name));
                Template::parse(t).map_err(StorageError::Unsupported)?.render(&vars)
            }
        })
    }

    async fn run(&self, cmd: &Command) -> Result<crate::backends::exec::Output, StorageError> {
        // the timeout is the command's own: waiting for a turn is not the filesystem being slow
        let _turn = self.running.acquire().await.expect("the semaphore is never closed");
        Ok(self.transport.run(cmd, self.settings.storage_timeout).await?)
    }
}

/// Lustre quotas are per user (homes) and per group (a tenant's scratch).
fn lustre_owner(dir: &Dir) -> (&'static str, String) {
    match dir {
        Dir::Home(u) => ("-u", u.to_string()),
        Dir::Scratch(t) => ("-g", t.to_string()),
    }
}

fn missing(flag: &str) -> StorageError {
    StorageError::Unsupported(format!("the command backend needs {flag}"))
}

impl Storage for CommandStorage {
    fn set_quota<'a>(&'a self, target: &'a Place, quota: Quota) -> StorageFuture<'a, ()> {
        Box::pin(async move {
            let cmd = self.quota_command(target, quota)?;
            let out = self.run(&cmd).await?;
            if !out.success() {
                return Err(StorageError::Failed { command: cmd.to_string(), code: out.code, message: message(&out) });
            }
            Ok(())
        })
    }

    fn quota<'a>(&'a self, target: &'a Place) -> StorageFuture<'a, Option<Limits>> {
        Box::pin(async move {
            let Some(cmd) = self.quota_read_command(target) else {
                return Err(StorageError::Unsupported("the command backend has no quota read-back".into()));
            };
            let out = self.run(&cmd).await?;
            if !out.success() {
                return Err(StorageError::Failed { command: cmd.to_string(), code: out.code, message: message(&out) });
            }
            let parsed = match self.settings.storage_backend {
                Backend::Lustre => readback::parse_lfs(&out.stdout),
                _ => readback::parse_weka(&out.stdout, &self.settings.locate(target).path),
            };
            parsed.map_err(|e| StorageError::Failed { command: cmd.to_string(), code: out.code, message: e })
        })
    }

    fn locate(&self, target: &Place) -> Located {
        self.settings.locate(target)
    }

    fn snapshot<'a>(&'a self, target: &'a Place, name: &'a SnapshotName) -> StorageFuture<'a, Snapshot> {
        Box::pin(async move {
            let cmd = self.snapshot_command(target, name)?;
            let out = self.run(&cmd).await?;
            if out.success() {
                return Ok(Snapshot::Created);
            }
            let text = message(&out);
            if text.to_lowercase().contains(&self.settings.storage_exists_pattern.to_lowercase()) {
                return Ok(Snapshot::Exists);
            }
            Err(StorageError::Failed { command: cmd.to_string(), code: out.code, message: text })
        })
    }
}

fn message(out: &crate::backends::exec::Output) -> String {
    let s = if out.stderr.trim().is_empty() { &out.stdout } else { &out.stderr };
    s.trim().chars().take(500).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::exec::Output;
    use crate::dryrun::Recorder;

    fn storage(backend: Backend, r: &Recorder) -> CommandStorage {
        let s = StorageSettings {
            storage_backend: backend,
            storage_quota_command: Some("setq --who={user}{tenant} {path} {hard_bytes}".into()),
            storage_snapshot_command: Some("snap {fs} {name}".into()),
            ..Default::default()
        };
        CommandStorage::new(Arc::new(r.clone()), s).unwrap()
    }

    #[tokio::test]
    async fn commands_per_backend() {
        let r = Recorder::new();
        let home: Place = Dir::Home(Username::parse("alice").unwrap()).into();
        let scratch: Place = Dir::Scratch(TenantName::parse("tenant-foo").unwrap()).into();
        let q = Quota::parse("100GB", "90GB").unwrap();
        let w = storage(Backend::Weka, &r);
        assert_eq!(
            w.quota_command(&home, q).unwrap().to_string(),
            "weka fs quota set /home/alice --hard 100GB --soft 90GB"
        );
        assert_eq!(
            w.quota_command(&scratch, q).unwrap().to_string(),
            "weka fs quota set /tenant/tenant-foo/scratch --hard 100GB --soft 90GB"
        );
        let l = storage(Backend::Lustre, &r);
        assert_eq!(
            l.quota_command(&home, q).unwrap().to_string(),
            "lfs setquota -u alice -b 87890625 -B 97656250 /home"
        );
        // the registry's paths win over the settings' templates
        let reg_home = Dir::Home(Username::parse("alice").unwrap()).at(Some("/homes"));
        let reg_scratch = Dir::Scratch(TenantName::parse("tenant-foo").unwrap()).at(Some("/t/foo/scratch"));
        assert_eq!(w.locate(&reg_home), Located { path: "/homes/alice".into(), from: "registry" });
        assert_eq!(w.locate(&home).from, "settings");
        assert_eq!(w.quota_command(&reg_scratch, q).unwrap().argv()[4], "/t/foo/scratch");
        assert_eq!(
            w.quota_read_command(&reg_home).unwrap().to_string(),
            "weka fs quota list home --path /homes/alice --all -J"
        );
        assert_eq!(l.quota_command(&reg_home, q).unwrap().argv().last().unwrap(), "/homes");
        assert_eq!(l.quota_read_command(&reg_scratch).unwrap().to_string(), "lfs quota -g tenant-foo /t/foo/scratch");
        // a read-back is a read in plans and audits; the set is a change
        assert!(!crate::backends::record::is_write(&w.quota_read_command(&home).unwrap()));
        assert!(!crate::backends::record::is_write(&l.quota_read_command(&home).unwrap()));
        assert!(crate::backends::record::is_write(&w.quota_command(&home, q).unwrap()));
        let c = storage(Backend::Command, &r);
        assert!(c.quota_read_command(&home).is_none());
        assert_eq!(c.quota_command(&home, q).unwrap().argv(), ["setq", "--who=alice", "/home/alice", "100000000000"]);
        let name = SnapshotName::offboard(&Username::parse("alice").unwrap(), time::macros::date!(2026 - 11 - 30));
        assert_eq!(name.as_str(), "offboard-alice-20261130");
        assert_eq!(c.snapshot_command(&home, &name).unwrap().to_string(), "snap home offboard-alice-20261130");
    }

    #[tokio::test]
    async fn existing_snapshot_is_not_an_error() {
        let r = Recorder::replying(|_| Output {
            code: 1,
            stderr: "error: Snapshot already exists".into(),
            ..Default::default()
        });
        let home: Place = Dir::Home(Username::parse("alice").unwrap()).into();
        let name = SnapshotName::parse("s1").unwrap();
        assert_eq!(storage(Backend::Weka, &r).snapshot(&home, &name).await.unwrap(), Snapshot::Exists);
        let r = Recorder::replying(|_| Output { code: 1, stderr: "permission denied".into(), ..Default::default() });
        let e = storage(Backend::Weka, &r).snapshot(&home, &name).await.unwrap_err();
        assert!(!e.is_retryable() && e.to_string().contains("permission denied"));
    }

    use std::time::Duration;

    /// Counts the commands running at once.
    #[derive(Default)]
    struct Counting {
        now: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    impl Transport for Counting {
        fn run<'a>(&'a self, _: &'a Command, _: Duration) -> crate::backends::exec::RunFuture<'a> {
            use std::sync::atomic::Ordering::SeqCst;
            Box::pin(async move {
                let now = self.now.fetch_add(1, SeqCst) + 1;
                self.most.fetch_max(now, SeqCst);
                tokio::time::sleep(Duration::from_millis(10)).await;
                self.now.fetch_sub(1, SeqCst);
                Ok(Output::default())
            })
        }
    }

    #[tokio::test]
    async fn no_more_commands_run_at_once_than_the_setting_allows() {
        let counting = Arc::new(Counting::default());
        let s = StorageSettings { storage_concurrency: 3, ..Default::default() };
        let storage = Arc::new(CommandStorage::new(counting.clone(), s).unwrap());
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..20 {
            let storage = storage.clone();
            tasks.spawn(async move {
                let home: Place = Dir::Home(Username::parse(&format!("u{i}")).unwrap()).into();
                storage.set_quota(&home, Quota::parse("10GB", "8GB").unwrap()).await.unwrap();
            });
        }
        while let Some(r) = tasks.join_next().await {
            r.unwrap();
        }
        assert_eq!(counting.most.load(std::sync::atomic::Ordering::SeqCst), 3);
    }
}

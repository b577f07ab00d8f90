//! Storage backends against a fake `weka`/`lfs`/`lctl` (`onramp-fakes` under those names) that checks
//! the arguments as the real CLIs' syntax requires and records them.

use std::sync::Arc;

use onramp::backends::exec::Local;
use onramp::backends::storage::{
    Backend, CommandStorage, Dir, Place, Quota, Snapshot, SnapshotName, Storage, StorageError, StorageSettings,
};
use onramp::domain::names::{TenantName, Username};
use serde_json::Value;

struct FakeCli {
    dir: tempfile::TempDir,
}

impl FakeCli {
    fn install() -> Self {
        let dir = tempfile::Builder::new().prefix("onramp-storage-").tempdir().unwrap();
        crate::common::install_storage_cli(dir.path(), &["weka", "lfs", "lctl"]);
        Self { dir }
    }
    fn bin(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
    fn calls(&self) -> Vec<Vec<String>> {
        let text = std::fs::read_to_string(self.dir.path().join("calls.jsonl")).unwrap_or_default();
        text.lines()
            .map(|l| serde_json::from_str::<Value>(l).unwrap())
            .map(|v| serde_json::from_value(v).unwrap())
            .collect()
    }
    fn storage(&self, backend: Backend, f: impl FnOnce(&mut StorageSettings)) -> CommandStorage {
        let mut s = StorageSettings {
            storage_backend: backend,
            weka_bin: self.bin("weka"),
            lfs_bin: self.bin("lfs"),
            lctl_bin: self.bin("lctl"),
            ..Default::default()
        };
        f(&mut s);
        CommandStorage::new(Arc::new(Local), s).unwrap()
    }
}

fn alice() -> Place {
    Dir::Home(Username::parse("alice").unwrap()).into()
}

#[tokio::test]
async fn weka_quotas_and_snapshots() {
    let cli = FakeCli::install();
    let w = cli.storage(Backend::Weka, |_| {});
    let q = Quota::parse("100GB", "90GB").unwrap();
    w.set_quota(&alice(), q).await.unwrap();
    w.set_quota(&alice(), q).await.unwrap();
    let scratch: Place = Dir::Scratch(TenantName::parse("tenant-foo").unwrap()).into();
    w.set_quota(&scratch, Quota::parse("50TB", "45TB").unwrap()).await.unwrap();
    let name = SnapshotName::parse("offboard-alice-20261130").unwrap();
    assert_eq!(w.snapshot(&alice(), &name).await.unwrap(), Snapshot::Created);
    assert_eq!(w.snapshot(&alice(), &name).await.unwrap(), Snapshot::Exists);
    let calls = cli.calls();
    assert_eq!(calls[0][1..], ["fs", "quota", "set", "/home/alice", "--hard", "100GB", "--soft", "90GB"]);
    assert_eq!(calls[0], calls[1], "the same quota twice is the same command");
    assert_eq!(calls[2][4..], ["/tenant/tenant-foo/scratch", "--hard", "50TB", "--soft", "45TB"]);
    assert_eq!(calls[3][1..], ["fs", "snapshot", "create", "home", "offboard-alice-20261130"]);

    // A failure is permanent and says what the CLI said.
    let bad = cli.storage(Backend::Weka, |s| s.storage_home_path = "/x/{user}/fail".into());
    let e = bad.set_quota(&alice(), q).await.unwrap_err();
    assert!(matches!(&e, StorageError::Failed { message, .. } if message.contains("not on a Weka filesystem")), "{e}");
    assert!(!e.is_retryable());
}

#[tokio::test]
async fn lustre_and_command_templates() {
    let cli = FakeCli::install();
    let l = cli.storage(Backend::Lustre, |_| {});
    l.set_quota(&alice(), Quota::parse("100GB", "90GB").unwrap()).await.unwrap();
    let name = SnapshotName::parse("s1").unwrap();
    assert_eq!(l.snapshot(&alice(), &name).await.unwrap(), Snapshot::Created);
    assert_eq!(l.snapshot(&alice(), &name).await.unwrap(), Snapshot::Exists);
    let calls = cli.calls();
    assert_eq!(calls[0][1..], ["setquota", "-u", "alice", "-b", "87890625", "-B", "97656250", "/home"]);
    assert_eq!(calls[1][1..], ["snapshot_create", "-F", "home", "-n", "s1"]);

    // The command backend: an argv template; here it drives the fake weka too.
    let t = cli.storage(Backend::Command, |s| {
        s.storage_quota_command =
            Some(format!("{} fs quota set {{path}} --hard {{hard}} --soft {{soft}}", cli.bin("weka")));
        s.storage_snapshot_command = Some(format!("{} fs snapshot create {{fs}} {{name}}", cli.bin("weka")));
    });
    t.set_quota(&alice(), Quota::parse("1TiB", "900GiB").unwrap()).await.unwrap();
    assert_eq!(t.snapshot(&alice(), &SnapshotName::parse("s2").unwrap()).await.unwrap(), Snapshot::Created);
    let calls = cli.calls();
    assert_eq!(calls[3][4..], ["/home/alice", "--hard", "1TiB", "--soft", "900GiB"]);
    assert_eq!(calls[4][4..], ["home", "s2"]);

    // A missing CLI is a spawn error, not a silent success.
    let none = cli.storage(Backend::Weka, |s| s.weka_bin = "/nonexistent/weka".into());
    assert!(none.set_quota(&alice(), Quota::parse("1GB", "1GB").unwrap()).await.is_err());
}

#[tokio::test]
async fn quotas_read_back_as_the_clis_list_them() {
    let cli = FakeCli::install();
    let q = Quota::parse("100GB", "90GB").unwrap();
    // Weka, at the tenant registry's path (it wins over the settings' template)
    let w = cli.storage(Backend::Weka, |_| {});
    let home = Dir::Home(Username::parse("alice").unwrap()).at(Some("/homes"));
    assert_eq!(w.quota(&home).await.unwrap(), None, "nothing set yet");
    w.set_quota(&home, q).await.unwrap();
    let l = w.quota(&home).await.unwrap().unwrap();
    assert_eq!((l.hard_bytes, l.soft_bytes), (Some(100_000_000_000), Some(90_000_000_000)));
    assert!(l.diff(q).is_empty());
    let calls = cli.calls();
    assert_eq!(calls[1][1..], ["fs", "quota", "set", "/homes/alice", "--hard", "100GB", "--soft", "90GB"]);
    assert_eq!(calls[2][1..], ["fs", "quota", "list", "home", "--path", "/homes/alice", "--all", "-J"]);
    // a filesystem that drops the set: the read-back shows it
    std::fs::write(cli.dir.path().join("ignore-sets"), "").unwrap();
    let bob = Dir::Home(Username::parse("bob").unwrap()).into();
    w.set_quota(&bob, q).await.unwrap();
    assert_eq!(w.quota(&bob).await.unwrap(), None);
    std::fs::remove_file(cli.dir.path().join("ignore-sets")).unwrap();

    // Lustre: per user on the homes' filesystem, per group on scratch (a long path wraps)
    let l = cli.storage(Backend::Lustre, |_| {});
    l.set_quota(&alice(), q).await.unwrap();
    let got = l.quota(&alice()).await.unwrap().unwrap();
    assert!(got.diff(q).is_empty(), "{:?}", got.diff(q));
    let scratch = Dir::Scratch(TenantName::parse("tenant-foo").unwrap()).at(Some("/lustre/tenants/tenant-foo/scratch"));
    l.set_quota(&scratch, Quota::parse("50TB", "45TB").unwrap()).await.unwrap();
    let got = l.quota(&scratch).await.unwrap().unwrap();
    assert!(got.diff(Quota::parse("50TB", "45TB").unwrap()).is_empty());
    assert_eq!(got.diff(q).len(), 2, "{:?}", got.diff(q));
    let last = cli.calls().pop().unwrap();
    assert_eq!(last[1..], ["quota", "-g", "tenant-foo", "/lustre/tenants/tenant-foo/scratch"]);

    // the command backend has no read-back
    let c = cli.storage(Backend::Command, |s| s.storage_quota_command = Some("true".into()));
    assert!(matches!(c.quota(&alice()).await, Err(StorageError::Unsupported(_))));
}

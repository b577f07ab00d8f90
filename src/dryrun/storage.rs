//! The simulated filesystem CLI: every quota and snapshot command succeeds, and a quota set is
//! what the list commands report afterwards (`weka fs quota list … -J`, `lfs quota`), so the
//! flows' read-backs see their own quotas as a healthy filesystem would show them. A snapshot
//! taken again under its name answers "already exists", as the real CLIs do (the offboardings'
//! delete steps check their snapshot that way).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use crate::backends::exec::{Command, Output, RunFuture, Transport};
use crate::backends::storage::Size;

/// Quotas by where they were set: the Weka path, or Lustre's `-u/-g name mount`.
#[derive(Default)]
pub struct SimStorageCli {
    quotas: Mutex<BTreeMap<String, (u64, u64)>>,
    /// The snapshot commands that ran, as argv.
    snapshots: Mutex<BTreeSet<Vec<String>>>,
}

/// A snapshot create: Weka's, Lustre's, or (a command template) one naming an offboarding's
/// snapshot, `offboard-…` (the only snapshots onramp takes).
fn is_snapshot(argv: &[String]) -> bool {
    let a: Vec<&str> = argv.iter().map(String::as_str).collect();
    matches!(a.as_slice(), [_, "fs", "snapshot", "create", ..] | [_, "snapshot_create", ..])
        || a.iter().any(|x| x.contains("offboard-"))
}

fn ok(stdout: String) -> RunFuture<'static> {
    Box::pin(async move { Ok(Output { code: 0, stdout, ..Default::default() }) })
}

impl SimStorageCli {
    fn answer(&self, argv: &[String]) -> String {
        let mut q = self.quotas.lock().expect("sim storage");
        let a: Vec<&str> = argv.iter().map(String::as_str).collect();
        let bytes = |s: &str| Size::parse(s).map(|s| s.bytes()).unwrap_or(0);
        match a.as_slice() {
            [_, "fs", "quota", "set", path, "--hard", hard, "--soft", soft] => {
                q.insert((*path).to_string(), (bytes(hard), bytes(soft)));
                String::new()
            }
            [_, "fs", "quota", "list", _, "--path", path, ..] => {
                let found = q.get(*path).map(|(h, s)| {
                    json!({"path": path, "hardLimitBytes": h, "softLimitBytes": s, "usedBytes": 0, "status": "ACTIVE"})
                });
                json!(found.into_iter().collect::<Vec<_>>()).to_string()
            }
            [_, "setquota", flag, who, "-b", soft, "-B", hard, mount] => {
                let kib = |s: &str| s.parse::<u64>().unwrap_or(0) * 1024;
                q.insert(format!("{flag} {who} {mount}"), (kib(hard), kib(soft)));
                String::new()
            }
            [_, "quota", flag, who, mount] => {
                let (h, s) = q.get(&format!("{flag} {who} {mount}")).copied().unwrap_or((0, 0));
                let owner = if *flag == "-u" { "usr" } else { "grp" };
                format!(
                    "Disk quotas for {owner} {who} (id 0):\n     Filesystem  kbytes   quota   limit   grace   files   \
                     quota   limit   grace\n{mount:>15}       0 {:>8} {:>8}       -       0       0       0       -\n",
                    s / 1024,
                    h / 1024
                )
            }
            _ => String::new(),
        }
    }
}

impl Transport for SimStorageCli {
    fn run<'a>(&'a self, cmd: &'a Command, _: Duration) -> RunFuture<'a> {
        if is_snapshot(cmd.argv()) && !self.snapshots.lock().expect("sim storage").insert(cmd.argv().to_vec()) {
            let stderr = "error: Snapshot already exists".to_string();
            return Box::pin(async move { Ok(Output { code: 1, stderr, ..Default::default() }) });
        }
        ok(self.answer(cmd.argv()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_snapshot_taken_again_already_exists_and_quotas_set_again_succeed() {
        let sim = SimStorageCli::default();
        async fn run(sim: &SimStorageCli, argv: &[&str]) -> Output {
            let cmd = Command::new(argv[0]).args(argv[1..].iter().copied());
            sim.run(&cmd, Duration::from_secs(1)).await.unwrap()
        }
        let snap = ["weka", "fs", "snapshot", "create", "home", "offboard-alice-20261201"];
        assert_eq!(run(&sim, &snap).await.code, 0);
        let again = run(&sim, &snap).await;
        assert_eq!((again.code, again.stderr.contains("already exists")), (1, true));
        let other = ["lctl", "snapshot_create", "-F", "home", "-n", "offboard-alice-20261201"];
        assert_eq!(run(&sim, &other).await.code, 0);
        let quota = ["weka", "fs", "quota", "set", "/home/alice", "--hard", "10GB", "--soft", "9GB"];
        assert_eq!((run(&sim, &quota).await.code, run(&sim, &quota).await.code), (0, 0));
    }
}

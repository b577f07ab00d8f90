//! The simulated filesystem CLI: every quota and snapshot command succeeds, and a quota set is
//! what the list commands report afterwards (`weka fs quota list … -J`, `lfs quota`), so the
//! flows' read-backs see their own quotas as a healthy filesystem would show them.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use serde_json::json;

use crate::backends::exec::{Command, Output, RunFuture, Transport};
use crate::backends::storage::Size;

/// Quotas by where they were set: the Weka path, or Lustre's `-u/-g name mount`.
#[derive(Default)]
pub struct SimStorageCli {
    quotas: Mutex<BTreeMap<String, (u64, u64)>>,
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
        ok(self.answer(cmd.argv()))
    }
}

//! What the flows harnesses of a killed test run left in the shared Slurm test cluster. A harness
//! deletes its accounts, its QOS and carol's associations when it is dropped; a run killed in the
//! middle of a test drops nothing, and carol's associations in the dead run's accounts then fail
//! the next run's checks of her associations. A harness's names carry the id of the process that
//! made them (`fl`, six hex digits of the pid, six random ones; see `flows_support::uniq`), so the
//! first harness of a process deletes those of processes that no longer run, and leaves alone
//! those of a process that still does (the trace test's child, another `cargo test`).

use std::process::Command;
use std::time::{Duration, Instant};

use crate::slurm::{cancel_jobs, run};

/// The id of the process that made `name`, when it is a flows harness's name with one of
/// `suffixes` (`-acct`, `-ml`, `-other`, `-q`).
pub fn harness_pid(name: &str, suffixes: &[&str]) -> Option<u32> {
    let (id, suffix) = name.split_once('-')?;
    let hex = id.strip_prefix("fl")?;
    let lower_hex = hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if hex.len() != 12 || !lower_hex || !suffixes.contains(&suffix) {
        return None;
    }
    u32::from_str_radix(&hex[..6], 16).ok()
}

/// A harness's name of a process that no longer runs.
fn is_leftover(name: &str, suffixes: &[&str]) -> bool {
    harness_pid(name, suffixes).is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// Deletes what dead processes' harnesses left, once per process; every harness waits for it.
pub async fn sweep_once() {
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT.get_or_init(|| async { tokio::task::spawn_blocking(sweep).await.expect("the sweep ran") }).await;
}

/// The non-empty lines `sacctmgr -n -P <args>` prints.
fn show(args: &[&str]) -> Vec<String> {
    let out = Command::new("sacctmgr").args(["-n", "-P"]).args(args).output().expect("sacctmgr runs");
    assert!(out.status.success(), "sacctmgr {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect()
}

fn list(args: &[&str], suffixes: &[&str]) -> Vec<String> {
    show(args).into_iter().filter(|n| is_leftover(n, suffixes)).collect()
}

fn sweep() {
    // children (a team, another tenant's account) before their parents
    let mut accounts = list(&["show", "account", "format=account"], &["ml", "other", "acct"]);
    accounts.sort_by_key(|a| (a.ends_with("-acct"), a.clone()));
    let qos = list(&["show", "qos", "format=name"], &["q"]);
    if accounts.is_empty() && qos.is_empty() {
        return;
    }
    eprintln!("flows harness: deleting what a killed run left in Slurm: accounts {accounts:?}, QOS {qos:?}");
    cancel_jobs(&accounts, Instant::now() + Duration::from_secs(30));
    // one write at a time with the other tests' Slurm writes (slurmdbd 22.05 loses concurrent ones)
    let _turn = crate::slurm::write_lock().blocking_lock_owned();
    for a in &accounts {
        for u in show(&["show", "assoc", "where", &format!("account={a}"), "format=user"]) {
            run(&["sacctmgr", "-i", "delete", "user", "where", &format!("name={u}"), &format!("account={a}")]);
        }
        run(&["sacctmgr", "-i", "delete", "account", "where", &format!("name={a}")]);
    }
    if !qos.is_empty() {
        run(&["sacctmgr", "-i", "delete", "qos", "where", &format!("name={}", qos.join(","))]);
    }
    let left = list(&["show", "account", "format=account"], &["ml", "other", "acct"]);
    assert!(left.is_empty(), "the leftover accounts {left:?} could not be deleted; see `sacctmgr show assoc`");
}

#[test]
fn only_flows_harness_names_of_dead_processes_are_swept() {
    let all = ["ml", "other", "acct", "q"];
    for (name, pid) in [("fl0a1b2c00ff00-acct", 0x0a1b2c), ("fl000001abcdef-ml", 1), ("fl3fffffffffff-q", 0x3fffff)] {
        assert_eq!(harness_pid(name, &all), Some(pid), "{name}");
    }
    for name in
        ["ot0a1b2c00ff00-acct", "fl0a1b2c-acct", "fl0a1b2c00ff001-acct", "fl0A1B2C00FF00-acct", "fl0a1b2c00ff00-x"]
    {
        assert_eq!(harness_pid(name, &all), None, "{name}");
    }
    assert_eq!(harness_pid("fl0a1b2c00ff00-q", &["acct"]), None);
    // this process runs: its names stay; an exited child's are left over
    let mine = format!("fl{:06x}000000-acct", std::process::id());
    assert!(!is_leftover(&mine, &all));
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    assert!(is_leftover(&format!("fl{dead:06x}abcdef-ml"), &all));
}

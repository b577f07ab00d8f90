//! An unreachable slurmdbd and hostile names on the test cluster (doctor: tests/it/doctor.rs).

use std::sync::Arc;
use std::time::Duration;

use onramp::backends::exec::{Command, RunFuture, Transport};

use super::*;

/// Runs every command as `env SLURM_CONF=<conf> …`: a slurm.conf whose slurmdbd port is closed.
struct BadConf(String);

impl Transport for BadConf {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        let c = Command::new("env").arg(format!("SLURM_CONF={}", self.0)).args(cmd.argv().iter().cloned());
        Box::pin(async move { LOCAL.run(&c, timeout).await })
    }
}

#[tokio::test]
async fn an_unreachable_slurmdbd_is_retryable() {
    cluster_up();
    let conf = std::env::temp_dir().join(format!("{}.conf", uniq("badslurm")));
    let real = std::fs::read_to_string("/etc/slurm/slurm.conf").unwrap();
    let bad: String = real
        .lines()
        .filter(|l| !l.starts_with("AccountingStoragePort"))
        .map(|l| {
            if l.starts_with("AccountingStorageHost") {
                format!("{l}\nAccountingStoragePort=1\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&conf, bad).unwrap();
    let s = SlurmCli::new(Arc::new(BadConf(conf.to_str().unwrap().into())), cluster());
    let e = s.ensure_tenant(&tenant(&uniq("t"), &[])).await.unwrap_err();
    assert!(matches!(e, SlurmError::Unreachable { .. }) && e.is_retryable(), "{e:?}");
    std::fs::remove_file(&conf).unwrap();
}

#[tokio::test]
async fn hostile_names_never_reach_an_argv() {
    for s in ["-rf", "--help", "a;rm -rf /", "$(id)", "`id`", "a b", "ünï", "a,b", "a=b", "a|b", "x\ny", "'", "Alice"]
    {
        assert!(Username::parse(s).is_err(), "{s:?}");
        assert!(SlurmAccount::parse(s).is_err(), "{s:?}");
        assert!(QosName::parse(s).is_err(), "{s:?}");
        assert!(ClusterName::parse(s).is_err(), "{s:?}");
    }
    for s in ["-x", "a=b", "a,b", "$(id)", "a;b", "ünï", "a\nb"] {
        assert!(SlurmText::parse(s).is_err(), "{s:?}");
    }
    // Everything that does reach an argv is one element each, with only expected characters.
    let rec = onramp::dryrun::Recorder::new();
    let s = SlurmCli::new(Arc::new(rec.clone()), cluster()).with_write_gate(writes());
    let spec = tenant("tenant-foo", &["ml-team-foo"]);
    let _ = s.ensure_tenant(&spec).await;
    let u =
        UserSpec { user: user("alice"), account: acct("ml-team-foo"), default_account: true, limits: user_limits() };
    let _ = s.ensure_user(&u).await;
    let _ = s.add_users(&acct("ml-team-foo"), &[user("bob"), user("carol")], true, &user_limits()).await;
    let _ = s.block_user(&user("alice"), &[acct("ml-team-foo")]).await;
    let _ = s.cancel_pending(&JobScope::UserIn(user("alice"), vec![acct("ml-team-foo"), acct("tenant-foo")])).await;
    let _ = s.cancel_pending(&JobScope::User(user("alice"))).await;
    let _ = s.delete_account(&acct("tenant-foo")).await;
    let cmds = rec.commands();
    assert!(cmds.len() >= 6);
    for c in &cmds {
        for a in c.argv() {
            let text_value = a.starts_with("Description=") || a.starts_with("Organization=");
            assert!(
                a.chars().all(|ch| ch.is_ascii_alphanumeric() || "-_=,/.%|".contains(ch) || (text_value && ch == ' ')),
                "{a:?} in {c}"
            );
        }
    }
}

/// Runs commands here, except that the first `add account` answers as slurmdbd does when it
/// loses a write to a concurrent one: success, and nothing added.
struct LosesFirstAdd(std::sync::atomic::AtomicBool);

impl Transport for LosesFirstAdd {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        Box::pin(async move {
            let add = cmd.argv().windows(2).any(|w| w[0] == "add" && w[1] == "account");
            if add && !self.0.swap(true, std::sync::atomic::Ordering::SeqCst) {
                let stdout = " Adding Account(s)\n".to_string();
                return Ok(onramp::backends::exec::Output { code: 0, stdout, stderr: String::new() });
            }
            LOCAL.run(cmd, timeout).await
        })
    }
}

#[tokio::test]
async fn a_lost_add_of_a_tenant_account_is_retryable_and_the_next_attempt_adds_it() {
    let (t, a) = (uniq("t"), uniq("a"));
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![] };
    let s = SlurmCli::new(Arc::new(LosesFirstAdd(Default::default())), cluster()).with_write_gate(writes());
    let spec = tenant(&t, &[&a]);
    // the team's add finds no parent: not a mistake in the spec, the tenant's add was lost
    let e = s.ensure_tenant(&spec).await.unwrap_err();
    assert!(matches!(&e, SlurmError::NotConverged { what, .. } if what.contains(&t)) && e.is_retryable(), "{e:?}");
    let done = s.ensure_tenant(&spec).await.unwrap();
    assert_eq!(done.created, vec![t.clone(), a.clone()]);
}

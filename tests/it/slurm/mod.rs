//! The Slurm backend against the real test cluster (`scripts/slurm-test-cluster.sh start`):
//! every operation twice, limits changed in between, state read back; jobs of real unix users.
//! Names are unique per test; each test deletes what it made (also when it fails). Helpers here,
//! tests by area in the submodules.

mod accounts;
mod edges;
mod jobs;
mod limits;
mod qos;
mod users;

use std::sync::{Arc, OnceLock};

use onramp::backends::exec::Local;
use onramp::backends::slurm::*;
use onramp::domain::names::{ClusterName, QosName, SlurmAccount, Username};

/// Tests that need the node's two CPUs take turns.
pub static NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
pub static LOCAL: Local = Local;

/// Panics with what to do when the cluster is not there (checked once per test binary).
pub fn cluster_up() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    let up = UP.get_or_init(|| {
        let run = |p: &str, a: &[&str]| std::process::Command::new(p).args(a).output().map_err(|e| format!("{p}: {e}"));
        let o = run("scontrol", &["ping"])?;
        if !String::from_utf8_lossy(&o.stdout).contains("is UP") {
            return Err(format!("scontrol ping: {}", String::from_utf8_lossy(&o.stdout).trim()));
        }
        let o = run("sacctmgr", &["-n", "-P", "show", "cluster", "format=cluster"])?;
        if !String::from_utf8_lossy(&o.stdout).lines().any(|l| l == "production") {
            return Err(format!("sacctmgr show cluster: {}", String::from_utf8_lossy(&o.stderr).trim()));
        }
        Ok(())
    });
    if let Err(e) = up {
        panic!("the Slurm test cluster is not running ({e}): run `scripts/slurm-test-cluster.sh start`");
    }
}

pub fn cluster() -> ClusterName {
    ClusterName::parse("production").unwrap()
}

pub fn slurm() -> SlurmCli {
    cluster_up();
    SlurmCli::new(Arc::new(Local), cluster()).with_write_gate(writes())
}

/// The Slurm writes of these tests go one at a time, as onramp's replicas' do (slurmdbd 22.05
/// loses one of two concurrent writes): the tests run in parallel.
pub fn writes() -> Arc<dyn WriteGate> {
    static GATE: OnceLock<Arc<dyn WriteGate>> = OnceLock::new();
    GATE.get_or_init(|| Arc::new(OneAtATime(write_lock()))).clone()
}

/// The lock behind [`writes`], also taken by [`Cleanup`]'s deletes and the flows harness's sweep.
pub fn write_lock() -> Arc<tokio::sync::Mutex<()>> {
    static LOCK: OnceLock<Arc<tokio::sync::Mutex<()>>> = OnceLock::new();
    LOCK.get_or_init(Arc::default).clone()
}

struct OneAtATime(Arc<tokio::sync::Mutex<()>>);

impl WriteGate for OneAtATime {
    fn enter(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<GateGuard, String>> + Send + '_>> {
        Box::pin(async move { Ok(Box::new(self.0.clone().lock_owned().await) as GateGuard) })
    }
}

/// A name no other test (or test run) uses.
pub fn uniq(tag: &str) -> String {
    format!("ot{:06x}-{tag}", fastrand::u32(..0xff_ffff))
}

pub fn acct(s: &str) -> SlurmAccount {
    SlurmAccount::parse(s).unwrap()
}

pub fn user(s: &str) -> Username {
    Username::parse(s).unwrap()
}

pub fn qos(s: &str) -> QosName {
    QosName::parse(s).unwrap()
}

pub fn text(s: &str) -> SlurmText {
    SlurmText::parse(s).unwrap()
}

/// Deletes (best effort, synchronously) what a test made: jobs in its accounts, its users, its accounts.
pub struct Cleanup {
    pub accounts: Vec<String>,
    pub users: Vec<String>,
}

/// Runs a command to its end; what it printed (stdout, then stderr), empty when it did not start.
pub fn run(args: &[&str]) -> String {
    let o = std::process::Command::new(args[0]).args(&args[1..]).output();
    o.map(|o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
        .unwrap_or_default()
}

/// Cancels the jobs of `accounts` and polls until slurmctld has none of them left (or `end`).
pub fn cancel_jobs(accounts: &[String], end: std::time::Instant) {
    if accounts.is_empty() {
        return;
    }
    for a in accounts {
        run(&["scancel", &format!("--account={a}")]); // one account per call: a list cancels nothing
    }
    let list = accounts.join(",");
    while !run(&["squeue", "-h", "-o", "%i", &format!("--account={list}")]).trim().is_empty()
        && std::time::Instant::now() < end
    {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

impl Drop for Cleanup {
    /// Jobs first (polled until slurmctld has none left and slurmdbd lets the accounts go, for at
    /// most 30 s), then users, then accounts.
    fn drop(&mut self) {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let list = self.accounts.join(",");
        cancel_jobs(&self.accounts, end);
        // the deletes are writes too: one at a time with the other tests' (taken on a thread of its
        // own: this one may be an async runtime's)
        let lock = write_lock();
        std::thread::scope(|s| {
            s.spawn(|| {
                let _turn = lock.blocking_lock();
                if !self.users.is_empty() {
                    run(&["sacctmgr", "-i", "delete", "user", "where", &format!("name={}", self.users.join(","))]);
                }
                while !list.is_empty()
                    && run(&["sacctmgr", "-i", "delete", "account", "where", &format!("name={list}")])
                        .contains("Job(s) active")
                    && std::time::Instant::now() < end
                {
                    std::thread::sleep(std::time::Duration::from_millis(200));
                }
            });
        });
    }
}

pub fn tenant(name: &str, teams: &[&str]) -> TenantSpec {
    let t = acct(name);
    TenantSpec {
        account: AccountSpec {
            name: t.clone(),
            parent: None,
            description: text("Tenant Foo"),
            organization: text(name),
            limits: AccountLimits {
                fairshare: Some(Fairshare::Shares(300)),
                grp_tres: Some(Tres::gpus(4).with("cpu", 8).unwrap()),
                grp_jobs: Some(Limit::At(200)),
            },
        },
        teams: teams
            .iter()
            .map(|n| AccountSpec {
                name: acct(n),
                parent: Some(t.clone()),
                description: text("Tenant Foo ML Team"),
                organization: text(name),
                limits: AccountLimits { fairshare: Some(Fairshare::Shares(200)), ..Default::default() },
            })
            .collect(),
    }
}

pub fn user_limits() -> UserLimits {
    UserLimits {
        fairshare: Some(Fairshare::Parent),
        default_qos: Some(qos("normal")),
        qos: Some(vec![qos("normal")]),
        max_jobs: Some(Limit::At(20)),
        grp_jobs: None,
        grp_tres_mins: Some(Tres::gpus(10000)),
    }
}

pub fn assoc<'a>(all: &'a [Association], account: &str, user: &str) -> &'a Association {
    all.iter()
        .find(|a| a.account == account && a.user == user)
        .unwrap_or_else(|| panic!("no association {account}/{user} in {all:#?}"))
}

pub fn runuser(unix: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("runuser").args(["-u", unix, "--"]).args(args).output().unwrap()
}

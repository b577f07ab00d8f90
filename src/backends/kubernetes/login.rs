//! Work on a tenant's login pod, through any [`Transport`] (the exec transport in production):
//! create `$HOME` ahead of first login, check that the user's key is projected, and run the
//! smoke test as the user. Argv commands only; names are checked types.
//!
//! `$HOME` is built beside its final place (`<root>/.onramp-new-<user>`: skel copied, owner set
//! by number, mode 700) and renamed into place in one step. An existing `$HOME` is never
//! written to: a re-run finds it, checks its owner, and changes nothing, so a user's files
//! (and their edited skel files) are never clobbered.

use std::sync::Arc;
use std::time::Duration;

use super::K8sSettings;
use super::keys::{KeyState, compare};
use crate::backends::exec::{Command, Output, Transport, TransportError};
use crate::domain::names::{SlurmAccount, Username};
use crate::domain::sshkey::PublicKey;

#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    #[error("login pod: {0}")]
    Transport(#[from] TransportError),
    #[error("login pod: `{command}` exited with {code}: {stderr}")]
    Failed { command: String, code: i32, stderr: String },
    #[error(
        "login pod: {path} exists but is owned by {found}, not {expected} (NSS/LDAP was down when it was made?); fix the owner by hand"
    )]
    HomeOwner { path: String, found: String, expected: String },
    #[error("login pod: cannot read `{command}` output {output:?}")]
    Unreadable { command: String, output: String },
}

impl LoginError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Transport(t) if t.is_transient())
    }

    /// How long the API server asked to wait before the next try (a 429 on the exec).
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        match self {
            Self::Transport(t) => t.retry_after(),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HomeOutcome {
    Created,
    /// It was there with the right owner; nothing was touched.
    Unchanged,
}

/// What the smoke test saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmokeReport {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub expected: (u32, u32),
    pub sbatch: Output,
    pub accounts: Vec<String>,
    pub account: String,
    /// The user as a compute node's slurmd resolves them (`srun` as the user).
    pub compute: ComputeIds,
}

/// `id -u; id -g` in a job step on a compute node, and the node that ran it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ComputeIds {
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub node: String,
    pub srun: Output,
}

/// What the runbook says when numbers differ between pods.
pub const NOBODY_DIAGNOSIS: &str = "files appear owned by nobody:nogroup: UID/GID inconsistency between login pod \
     and slurmd; check getent passwd and id on both; usually nslcd config drift or a stale cache (nscd -i passwd)";

fn ids(uid: Option<u32>, gid: Option<u32>) -> String {
    let n = |v: Option<u32>| v.map_or("?".to_string(), |v| v.to_string());
    format!("uid {} gid {}", n(uid), n(gid))
}

impl SmokeReport {
    /// Each failed check with its likely cause, in the runbook's words. Empty = passed.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        let want = (Some(self.expected.0), Some(self.expected.1));
        let c = &self.compute;
        let login_ok = (self.uid, self.gid) == want;
        let compute_ok = !c.srun.success() || (c.uid, c.gid) == want;
        if !login_ok || !compute_ok {
            let node = if c.node.is_empty() { "a compute node" } else { c.node.as_str() };
            let slurmd = if c.srun.success() { ids(c.uid, c.gid) } else { "(srun failed)".into() };
            p.push(format!(
                "the user does not resolve to the same numbers (LDAP) everywhere: expected uid {} gid {}; login pod \
                 (id): {}; slurmd on {node} (srun id): {slurmd}; {NOBODY_DIAGNOSIS}",
                self.expected.0,
                self.expected.1,
                ids(self.uid, self.gid),
            ));
        }
        if !self.sbatch.success() {
            p.push(format!("sbatch --test-only failed ({}): {}", self.sbatch.code, self.sbatch.stderr.trim()));
        }
        if !c.srun.success() {
            p.push(format!("srun on a compute node failed ({}): {}", c.srun.code, c.srun.stderr.trim()));
        }
        if !self.accounts.contains(&self.account) {
            p.push(format!("no Slurm association for account {} (sacctmgr shows {:?})", self.account, self.accounts));
        }
        p
    }
    pub fn passed(&self) -> bool {
        self.problems().is_empty()
    }
    /// When the only problem is that no compute node was free within srun's wait (the node is
    /// full, or the tenant is at its limits): worth trying again later, with why.
    pub fn retry_reason(&self) -> Option<String> {
        let srun = &self.compute.srun;
        let busy = !srun.success() && srun.stderr.contains("Requested nodes are busy");
        (busy && self.problems().len() == 1)
            .then(|| format!("no compute node was free for the smoke test's job step: {}", srun.stderr.trim()))
    }
}

/// One tenant's login pod.
#[derive(Clone)]
pub struct LoginPod {
    transport: Arc<dyn Transport>,
    settings: K8sSettings,
    timeout: Duration,
}

impl LoginPod {
    pub fn new(transport: Arc<dyn Transport>, settings: K8sSettings, timeout: Duration) -> Self {
        Self { transport, settings, timeout }
    }

    pub fn home(&self, user: &Username) -> String {
        format!("{}/{user}", self.settings.home_root.trim_end_matches('/'))
    }

    async fn run(&self, cmd: Command) -> Result<Output, LoginError> {
        Ok(self.transport.run(&cmd, self.timeout).await?)
    }

    async fn must(&self, cmd: Command) -> Result<Output, LoginError> {
        let out = self.run(cmd.clone()).await?;
        if out.success() {
            Ok(out)
        } else {
            Err(LoginError::Failed { command: cmd.to_string(), code: out.code, stderr: out.stderr.trim().into() })
        }
    }

    /// `test -e`: whether a path exists (exit 1 = no), whatever language error messages are in.
    async fn exists(&self, path: &str) -> Result<bool, LoginError> {
        let cmd = Command::new("test").args(["-e", path]);
        match self.run(cmd.clone()).await? {
            o if o.code == 0 => Ok(true),
            o if o.code == 1 => Ok(false),
            o => Err(LoginError::Failed { command: cmd.to_string(), code: o.code, stderr: o.stderr.trim().into() }),
        }
    }

    /// Creates `$HOME` owned by `uid:gid` (numbers, not names), mode 700, from the skeleton.
    pub async fn ensure_home(&self, user: &Username, uid: u32, gid: u32) -> Result<HomeOutcome, LoginError> {
        let home = self.home(user);
        let owner = format!("{uid}:{gid}");
        let stat = Command::new("stat").args(["-c", "%u:%g", "--", &home]);
        let out = self.run(stat.clone()).await?;
        if out.success() {
            let found = out.stdout.trim();
            if found == owner {
                return Ok(HomeOutcome::Unchanged);
            }
            return Err(LoginError::HomeOwner { path: home, found: found.into(), expected: owner });
        }
        if self.exists(&home).await? {
            return Err(LoginError::Failed {
                command: stat.to_string(),
                code: out.code,
                stderr: out.stderr.trim().into(),
            });
        }
        let new = format!("{}/.onramp-new-{user}", self.settings.home_root.trim_end_matches('/'));
        let skel = format!("{}/.", self.settings.skel_dir.trim_end_matches('/'));
        // Leftovers of an interrupted run are ours (the name is onramp's own): start afresh.
        self.must(Command::new("rm").args(["-rf", "--", &new])).await?;
        self.must(Command::new("mkdir").args(["-m", "700", "--", &new])).await?;
        self.must(Command::new("cp").args(["-R", "-p", "--", &skel, &new])).await?;
        self.must(Command::new("chown").args(["-R", "--", &owner, &new])).await?;
        self.must(Command::new("chmod").args(["700", "--", &new])).await?;
        // -T: never move into an existing directory; fails if $HOME appeared meanwhile.
        self.must(Command::new("mv").args(["-T", "--", &new, &home])).await?;
        Ok(HomeOutcome::Created)
    }

    /// Whether `authorized_keys.d/<user>` in the pod holds the expected key.
    pub async fn key_projected(&self, user: &Username, expected: &PublicKey) -> Result<KeyState, LoginError> {
        let path = format!("{}/{user}", self.settings.authorized_keys_dir.trim_end_matches('/'));
        let cmd = Command::new("cat").args(["--", &path]);
        let out = self.run(cmd.clone()).await?;
        if out.success() {
            Ok(compare(&out.stdout, expected))
        } else if !self.exists(&path).await? {
            Ok(KeyState::Missing)
        } else {
            Err(LoginError::Failed { command: cmd.to_string(), code: out.code, stderr: out.stderr.trim().into() })
        }
    }

    /// `--login-run-as` with `{user}` replaced, per argv element.
    pub fn as_user(&self, user: &Username) -> Command {
        let mut parts = self.settings.login_run_as.split_whitespace().map(|p| p.replace("{user}", user.as_str()));
        let first = parts.next().unwrap_or_else(|| "sudo".into());
        Command::new(&first).args(parts)
    }

    /// The sbatch command of the smoke test.
    pub fn sbatch_test(&self, user: &Username, account: &SlurmAccount) -> Command {
        let mut c = self.as_user(user).args(["sbatch", "--test-only"]).arg(format!("--account={account}"));
        if !self.settings.smoke_gres.is_empty() {
            c = c.arg(format!("--gres={}", self.settings.smoke_gres));
        }
        c.args(["--time=10:00", "--wrap", "echo ok"])
    }

    /// The smoke test's job step: `id -u; id -g` and the node's name, as the user, on a compute
    /// node, with the tenant's account and the smoke gres. Bounded: it waits for resources at most
    /// half the command timeout (`--immediate`, at most a minute) and runs at most a minute.
    pub fn srun_ids(&self, user: &Username, account: &SlurmAccount) -> Command {
        self.srun_named(user, account, SMOKE_JOB)
    }

    /// [`Self::srun_ids`] under the job name `name`.
    pub fn srun_named(&self, user: &Username, account: &SlurmAccount, name: &str) -> Command {
        let mut c =
            self.as_user(user).args(["srun", "--quiet", "--ntasks=1", "--time=1"]).arg(format!("--job-name={name}"));
        let wait = (self.timeout.as_secs() / 2).clamp(1, 60);
        c = c.arg(format!("--immediate={wait}")).arg(format!("--account={account}"));
        if !self.settings.smoke_gres.is_empty() {
            c = c.arg(format!("--gres={}", self.settings.smoke_gres));
        }
        c.args(["sh", "-c", "id -u; id -g; echo \"$SLURMD_NODENAME\""])
    }

    /// Runs [`Self::srun_ids`]; a refused or failed step is reported, not an error.
    pub async fn compute_ids(&self, user: &Username, account: &SlurmAccount) -> Result<ComputeIds, LoginError> {
        self.compute_ids_once(user, account, &SmokeRun::default()).await
    }

    /// As [`Self::compute_ids`], under `run`'s job name; when `run.again`, the job an earlier
    /// attempt ran under that name is looked up first (see [`Self::earlier_smoke`]).
    pub async fn compute_ids_once(
        &self,
        user: &Username,
        account: &SlurmAccount,
        run: &SmokeRun,
    ) -> Result<ComputeIds, LoginError> {
        if run.again
            && let Some(done) = self.earlier_smoke(user, &run.name).await?
        {
            return Ok(done);
        }
        let srun = self.run(self.srun_named(user, account, &run.name)).await?;
        if !srun.success() {
            return Ok(ComputeIds { srun, ..Default::default() });
        }
        let mut lines = srun.stdout.lines().map(str::trim);
        let (uid, gid) = (lines.next().and_then(|l| l.parse().ok()), lines.next().and_then(|l| l.parse().ok()));
        let node = lines.next().unwrap_or_default().to_string();
        if uid.is_none() || gid.is_none() {
            return Err(LoginError::Unreadable { command: "srun id -u; id -g".into(), output: srun.stdout });
        }
        Ok(ComputeIds { uid, gid, node, srun })
    }

    /// Runs `id`, `sbatch --test-only`, `sacctmgr show association` and, through Slurm on a
    /// compute node, `id -u; id -g`, as the user.
    pub async fn smoke_test(
        &self,
        user: &Username,
        account: &SlurmAccount,
        uid: u32,
        gid: u32,
    ) -> Result<SmokeReport, LoginError> {
        self.smoke_test_once(user, account, (uid, gid), &SmokeRun::default()).await
    }

    /// [`Self::smoke_test`] whose compute job runs once per `run` (see [`Self::compute_ids_once`]).
    pub async fn smoke_test_once(
        &self,
        user: &Username,
        account: &SlurmAccount,
        (uid, gid): (u32, u32),
        run: &SmokeRun,
    ) -> Result<SmokeReport, LoginError> {
        let id = self.must(self.as_user(user).arg("id")).await?;
        let field = |name: &str| {
            id.stdout
                .split_whitespace()
                .find_map(|f| f.strip_prefix(name))
                .and_then(|v| v.split('(').next()?.parse::<u32>().ok())
        };
        let (u, g) = (field("uid="), field("gid="));
        if u.is_none() || g.is_none() {
            return Err(LoginError::Unreadable { command: "id".into(), output: id.stdout });
        }
        let sbatch = self.run(self.sbatch_test(user, account)).await?;
        let assoc = self
            .as_user(user)
            .args(["sacctmgr", "-n", "-P", "show", "association"])
            .arg(format!("user={user}"))
            .arg("format=account");
        let accounts =
            self.must(assoc).await?.stdout.lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect();
        let compute = self.compute_ids_once(user, account, run).await?;
        Ok(SmokeReport {
            uid: u,
            gid: g,
            expected: (uid, gid),
            sbatch,
            accounts,
            account: account.to_string(),
            compute,
        })
    }
}

/// The smoke test's job name when no run names it.
pub const SMOKE_JOB: &str = "onramp-smoke";

/// Which smoke job a run is: its job name, and whether an earlier attempt may have run it.
#[derive(Clone, Debug)]
pub struct SmokeRun {
    pub name: String,
    pub again: bool,
}

impl Default for SmokeRun {
    fn default() -> Self {
        Self { name: SMOKE_JOB.into(), again: false }
    }
}

impl LoginPod {
    /// The smoke job an earlier attempt ran under `name`, as the user: from slurmctld (`squeue -t
    /// all`, which still lists jobs that ended in the last MinJobAge, at once), else from Slurm's
    /// accounting (`sacct`, the last 7 days; it learns of a job's end a moment later). One that
    /// completed is that attempt's result, whose worker died before recording it: its ids and node
    /// are taken from the record and the job is not run again. One still pending or running is a
    /// retryable error (wait for it). `None`: none ran, or none completed.
    pub async fn earlier_smoke(&self, user: &Username, name: &str) -> Result<Option<ComputeIds>, LoginError> {
        let squeue = self.as_user(user).args(["squeue", "-h", "-t", "all", "-o", "%i|%T|%U|%G|%N"]);
        // this user's only: another onramp (a staging one) may name its own jobs alike
        let out = self.must(squeue.arg(format!("--user={user}")).arg(format!("--name={name}"))).await?;
        if let Some(found) = earlier_in(&out.stdout, name)? {
            return Ok(Some(found));
        }
        let sacct = self.as_user(user).args(["sacct", "-n", "-P", "-X", "-S", "now-7days"]);
        let out = self.must(sacct.arg(format!("--name={name}")).arg("--format=JobID,State,UID,GID,NodeList")).await?;
        earlier_in(&out.stdout, name)
    }
}

/// The smoke job in `JobID|State|UID|GID|NodeList` lines (see [`LoginPod::earlier_smoke`]).
fn earlier_in(lines: &str, name: &str) -> Result<Option<ComputeIds>, LoginError> {
    for line in lines.lines() {
        let f: Vec<&str> = line.trim().split('|').collect();
        let [job, state, uid, gid, node] = f[..] else { continue };
        if state.starts_with("COMPLETED") {
            let srun = Output {
                stdout: format!("{uid}\n{gid}\n{node}\n"),
                stderr: format!("job {job} of an earlier attempt, completed"),
                ..Default::default()
            };
            return Ok(Some(ComputeIds { uid: uid.parse().ok(), gid: gid.parse().ok(), node: node.into(), srun }));
        }
        if ["PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "REQUEUED"].iter().any(|s| state.starts_with(s)) {
            let why = format!("the smoke job {job} ({name}) of an earlier attempt is still {state}");
            return Err(LoginError::Transport(TransportError::Transient(why)));
        }
    }
    Ok(None)
}

#[cfg(test)]
#[path = "login_tests.rs"]
mod tests;

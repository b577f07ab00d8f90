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
        matches!(self, Self::Transport(TransportError::Transient(_) | TransportError::Timeout { .. }))
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
}

impl SmokeReport {
    /// Each failed check with its likely cause, in the runbook's words. Empty = passed.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        if (self.uid, self.gid) != (Some(self.expected.0), Some(self.expected.1)) {
            p.push(format!(
                "id shows uid {:?} gid {:?}, expected {}:{}: the login pod does not resolve the user through LDAP (files would be owned by nobody)",
                self.uid, self.gid, self.expected.0, self.expected.1
            ));
        }
        if !self.sbatch.success() {
            p.push(format!("sbatch --test-only failed ({}): {}", self.sbatch.code, self.sbatch.stderr.trim()));
        }
        if !self.accounts.contains(&self.account) {
            p.push(format!("no Slurm association for account {} (sacctmgr shows {:?})", self.account, self.accounts));
        }
        p
    }
    pub fn passed(&self) -> bool {
        self.problems().is_empty()
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

    /// Runs `id`, `sbatch --test-only` and `sacctmgr show association` as the user.
    pub async fn smoke_test(
        &self,
        user: &Username,
        account: &SlurmAccount,
        uid: u32,
        gid: u32,
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
        Ok(SmokeReport { uid: u, gid: g, expected: (uid, gid), sbatch, accounts, account: account.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dryrun::Recorder;

    fn pod(r: &Recorder) -> LoginPod {
        LoginPod::new(Arc::new(r.clone()), K8sSettings::default(), Duration::from_secs(5))
    }

    #[tokio::test]
    async fn existing_home_is_left_alone() {
        let r = Recorder::replying(|_| Output { stdout: "5001:5001\n".into(), ..Default::default() });
        let u = Username::parse("alice").unwrap();
        assert_eq!(pod(&r).ensure_home(&u, 5001, 5001).await.unwrap(), HomeOutcome::Unchanged);
        assert_eq!(r.commands().len(), 1);
        let e = pod(&r).ensure_home(&u, 5002, 5002).await.unwrap_err();
        assert!(matches!(e, LoginError::HomeOwner { .. }) && !e.is_retryable());
    }

    #[tokio::test]
    async fn new_home_is_built_aside_and_renamed() {
        let r = Recorder::replying(|c| match c.argv()[0].as_str() {
            "stat" | "test" => Output { code: 1, ..Default::default() },
            _ => Output::default(),
        });
        let u = Username::parse("alice").unwrap();
        assert_eq!(pod(&r).ensure_home(&u, 5001, 5001).await.unwrap(), HomeOutcome::Created);
        let cmds: Vec<String> = r.commands().iter().map(|c| c.to_string()).collect();
        assert_eq!(cmds.last().unwrap(), "mv -T -- /home/.onramp-new-alice /home/alice");
        assert!(cmds.contains(&"chown -R -- 5001:5001 /home/.onramp-new-alice".to_string()));
    }

    #[test]
    fn smoke_commands_and_diagnosis() {
        let r = Recorder::new();
        let (u, a) = (Username::parse("alice").unwrap(), SlurmAccount::parse("tenant-foo").unwrap());
        let c = pod(&r).sbatch_test(&u, &a);
        assert_eq!(c.argv()[..4], ["sudo", "-u", "alice", "-i"]);
        assert_eq!(c.argv().last().unwrap(), "echo ok");
        assert!(c.argv().contains(&"--gres=gpu:1".to_string()));
        let rep = SmokeReport {
            uid: Some(65534),
            gid: Some(65534),
            expected: (5001, 5001),
            sbatch: Output::default(),
            accounts: vec!["tenant-foo".into()],
            account: "tenant-foo".into(),
        };
        assert_eq!(rep.problems().len(), 1);
        assert!(rep.problems()[0].contains("nobody"));
    }
}

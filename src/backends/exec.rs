//! Commands separate from transports. A [`Command`] is an argv (never a shell string) built from
//! checked parts; a [`Transport`] decides where it runs: here (`Local`), or in a pod through the
//! Kubernetes exec API (in the kubernetes backend). Transports that run nothing live with the
//! simulated world (`crate::dryrun`).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// What to run: a program and its arguments, each one argv element.
#[derive(Clone, PartialEq, Eq)]
pub struct Command {
    argv: Vec<String>,
}

impl Command {
    pub fn new(program: &str) -> Self {
        Self { argv: vec![program.to_string()] }
    }
    /// One argv element. Callers pass checked names (see `crate::domain::names`) or fixed text.
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.argv.push(a.into());
        self
    }
    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.argv.extend(args.into_iter().map(Into::into));
        self
    }
    pub fn argv(&self) -> &[String] {
        &self.argv
    }
}

impl fmt::Display for Command {
    /// Shell-quoted for people to read (and paste); never executed as a string.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted: Vec<String> = self
            .argv
            .iter()
            .map(|a| {
                if !a.is_empty() && a.chars().all(|c| c.is_ascii_alphanumeric() || "-_=.,/:@%+".contains(c)) {
                    a.clone()
                } else {
                    format!("'{}'", a.replace('\'', "'\\''"))
                }
            })
            .collect();
        f.write_str(&quoted.join(" "))
    }
}

impl fmt::Debug for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Command({self})")
    }
}

/// What came back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.code == 0
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("could not start {program}: {reason}")]
    Spawn { program: String, reason: String },
    #[error("{program} did not finish within {after:?}")]
    Timeout { program: String, after: Duration },
    /// The transport itself failed (connection lost, API error); worth retrying.
    #[error("transport: {0}")]
    Transient(String),
    /// The transport cannot work as configured (forbidden, no such pod); a person must act.
    #[error("transport: {0}")]
    Permanent(String),
    /// The far side is rate limiting (a 429) and said when to come back: worth retrying then.
    #[error("transport: {why}")]
    Busy { why: String, retry_after: Duration },
}

impl TransportError {
    /// Worth running the command again later without a person acting.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient(_) | Self::Timeout { .. } | Self::Busy { .. })
    }

    /// How long the far side asked to wait before the next try, when it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Busy { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }
}

pub type RunFuture<'a> = Pin<Box<dyn Future<Output = Result<Output, TransportError>> + Send + 'a>>;

/// Where commands run.
pub trait Transport: Send + Sync {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a>;
}

/// Runs commands on this host.
#[derive(Clone, Debug, Default)]
pub struct Local;

impl Transport for Local {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        Box::pin(async move {
            let argv = cmd.argv();
            let program = argv[0].clone();
            let mut child = tokio::process::Command::new(&program);
            child.args(&argv[1..]).stdin(std::process::Stdio::null()).kill_on_drop(true);
            let parent = std::process::id();
            // SAFETY: the hook only calls prctl and getppid, which are async-signal-safe.
            unsafe { child.pre_exec(move || die_with(parent)) };
            let child = child.output();
            match tokio::time::timeout(timeout, child).await {
                Err(_) => Err(TransportError::Timeout { program, after: timeout }),
                Ok(Err(e)) => Err(TransportError::Spawn { program, reason: e.to_string() }),
                Ok(Ok(o)) => Ok(Output {
                    code: o.status.code().unwrap_or(-1),
                    stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
                }),
            }
        })
    }
}

/// Between fork and exec: the command is killed when this process dies. Without it, a `kill -9`
/// of onramp mid-`sacctmgr` leaves the command writing on while the write gate (a session of the
/// dead process) is free and another replica's write starts: slurmdbd 22.05 loses one of two
/// concurrent writes. (The signal follows the thread that started the command: commands start on
/// the runtime's worker threads, which live as long as the process.)
fn die_with(parent: u32) -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_PDEATHSIG takes a signal number and touches no memory.
    if unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // the parent may have died before the prctl: then nobody would signal this child
    if unsafe { libc::getppid() } as u32 != parent {
        return Err(std::io::Error::other("onramp exited while starting the command"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_for_people_only() {
        let c = Command::new("sacctmgr").args(["-i", "add", "user", "alice", "Account=ml-team"]).arg("it's");
        assert_eq!(c.to_string(), "sacctmgr -i add user alice Account=ml-team 'it'\\''s'");
        assert_eq!(c.argv().len(), 7);
    }

    #[tokio::test]
    async fn local_runs_an_argv_without_a_shell() {
        let c = Command::new("printf").args(["%s|", "$(id)", "a b"]);
        let o = Local.run(&c, Duration::from_secs(5)).await.unwrap();
        assert_eq!((o.code, o.stdout.as_str()), (0, "$(id)|a b|"));
        let o = Local.run(&Command::new("false"), Duration::from_secs(5)).await.unwrap();
        assert_eq!(o.code, 1);
        let e = Local.run(&Command::new("sleep").arg("5"), Duration::from_millis(100)).await.unwrap_err();
        assert!(matches!(e, TransportError::Timeout { .. }));
        let e = Local.run(&Command::new("/nonexistent/x"), Duration::from_secs(1)).await.unwrap_err();
        assert!(matches!(e, TransportError::Spawn { .. }));
    }
}

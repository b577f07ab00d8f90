//! Child processes of the world: the built binaries, each process's output kept in a log file,
//! SIGKILL and SIGTERM, and a restart with the same command line and environment.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// A process the world started, and how to start it again.
pub struct Proc {
    pub name: String,
    program: PathBuf,
    args: Vec<String>,
    env: BTreeMap<String, String>,
    pub log: PathBuf,
    child: Option<Child>,
}

impl Proc {
    /// Starts `program` with exactly `env` (nothing inherited but `PATH`), output to `log`.
    pub fn spawn(name: &str, program: &Path, args: &[String], env: BTreeMap<String, String>, log: PathBuf) -> Self {
        let mut p = Self { name: name.into(), program: program.into(), args: args.to_vec(), env, log, child: None };
        p.start();
        p
    }

    fn start(&mut self) {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&self.log).unwrap();
        let child = Command::new(&self.program)
            .args(&self.args)
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .envs(&self.env)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} ({}): {e}", self.name, self.program.display()));
        self.child = Some(child);
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// `kill -9`: the process dies at once, leases and connections left as they are.
    pub async fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.start_kill().unwrap();
            c.wait().await.unwrap();
        }
    }

    /// SIGKILL without waiting (for `Drop`).
    pub fn kill_now(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.start_kill();
        }
    }

    /// SIGTERM, then waits for it to exit: how it exited, or `None` if it did not within `grace`
    /// (then it is killed).
    pub async fn terminate(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let mut c = self.child.take()?;
        if let Some(pid) = c.id() {
            let _ = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
        }
        match tokio::time::timeout(grace, c.wait()).await {
            Ok(s) => s.ok(),
            Err(_) => {
                let _ = c.start_kill();
                let _ = c.wait().await;
                None
            }
        }
    }

    /// Starts it again, as it was started the first time.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "{} is still running", self.name);
        self.start();
    }

    /// Whether it exited (and how), without waiting.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    /// The last `n` lines of its output.
    pub fn tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }
}

/// A standalone fake (`onramp-fakes <which>`): the process and the URL it printed first.
pub async fn spawn_fake(bin: &Path, which: &str, extra: &[&str], log: PathBuf) -> (Child, String) {
    let mut child = Command::new(bin)
        .arg(which)
        .args(["--listen", "127.0.0.1:0"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {} {which}: {e}", bin.display()));
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await;
    let url = match first {
        Ok(Ok(Some(url))) if url.starts_with("http://") => url,
        other => panic!("onramp-fakes {which} printed no URL ({other:?}): {}", std::fs::read_to_string(&log).unwrap()),
    };
    // Keep reading stdout so the fake never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, url)
}

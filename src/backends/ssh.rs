//! The OpenSSH transport: runs a [`Command`] on another host (a bare-metal Slurm controller)
//! with the system's `ssh` client, never asking anything (`BatchMode=yes`), trusting only the
//! host keys in one pinned known_hosts file and logging in with one key file.
//!
//! OpenSSH sends the remote side one string, which the remote user's login shell parses. So
//! the argv is turned into that string by one function, [`remote_command`], which quotes every
//! element for a POSIX shell (the controller account's shell must be sh, bash, dash or zsh).

use std::path::PathBuf;
use std::time::Duration;

use super::exec::{Command, Local, Output, RunFuture, Transport, TransportError};

/// Where and as whom: the settings of `ONRAMP_SLURM_VIA=ssh`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SshSettings {
    /// The controller host (name or address).
    pub host: String,
    /// Remote user; `None`: the one in the ssh configuration (usually the local user's name).
    pub user: Option<String>,
    pub port: u16,
    /// The private key to log in with.
    pub key_file: PathBuf,
    /// The only host keys trusted (StrictHostKeyChecking=yes).
    pub known_hosts: PathBuf,
    /// How long establishing the connection may take.
    pub connect_timeout: Duration,
}

/// One argv as one string for a POSIX shell: every element single-quoted, single quotes
/// written as `'\''`. The shell's parse of the result is the argv again, whatever it holds.
pub fn remote_command(argv: &[String]) -> String {
    let quoted: Vec<String> = argv.iter().map(|a| format!("'{}'", a.replace('\'', r"'\''"))).collect();
    quoted.join(" ")
}

/// Runs commands on the controller over OpenSSH.
#[derive(Clone, Debug)]
pub struct Ssh {
    settings: SshSettings,
    program: String,
}

impl Ssh {
    pub fn new(settings: SshSettings) -> Self {
        Self { settings, program: "ssh".into() }
    }

    /// Uses another ssh client binary (tests).
    pub fn with_program(mut self, program: impl Into<String>) -> Self {
        self.program = program.into();
        self
    }

    /// The local `ssh` invocation that runs `cmd` remotely.
    pub fn invocation(&self, cmd: &Command) -> Command {
        let s = &self.settings;
        let known = format!("UserKnownHostsFile={}", s.known_hosts.display());
        let mut c = Command::new(&self.program).args([
            "-T",
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            &known,
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "IdentityAgent=none",
            "-o",
            "LogLevel=ERROR",
            "-F",
            "/dev/null",
        ]);
        c = c.arg("-o").arg(format!("ConnectTimeout={}", s.connect_timeout.as_secs().max(1)));
        c = c.arg("-i").arg(s.key_file.display().to_string());
        c = c.arg("-p").arg(s.port.to_string());
        if let Some(u) = &s.user {
            c = c.arg("-l").arg(u.clone());
        }
        c.arg("--").arg(s.host.clone()).arg(remote_command(cmd.argv()))
    }
}

/// Exit 255 is ssh's own failure. What a person must fix is permanent; a network hiccup is not.
fn classify(program: &str, out: Output) -> Result<Output, TransportError> {
    if out.code != 255 {
        return Ok(out);
    }
    let err = out.stderr.trim();
    let line = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("ssh failed without a message");
    const PERMANENT: &[&str] = &[
        "Host key verification failed",
        "Permission denied",
        "Could not resolve hostname",
        "No such file or directory",
        "UNPROTECTED PRIVATE KEY FILE",
        "bad permissions",
        "Load key",
        "REMOTE HOST IDENTIFICATION HAS CHANGED",
        "No RSA host key is known",
        "No ED25519 host key is known",
        "No ECDSA host key is known",
    ];
    if PERMANENT.iter().any(|p| err.contains(p)) {
        return Err(TransportError::Permanent(format!("{program}: {line}")));
    }
    if err.is_empty() {
        // the remote command itself exited 255
        return Ok(out);
    }
    Err(TransportError::Transient(format!("{program}: {line}")))
}

impl Transport for Ssh {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        Box::pin(async move {
            let ssh = self.invocation(cmd);
            let out = Local.run(&ssh, timeout).await?;
            classify(&self.settings.host, out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> SshSettings {
        SshSettings {
            host: "ctl1.example.org".into(),
            user: Some("slurmadm".into()),
            port: 2222,
            key_file: "/run/secrets/onramp/ssh_key".into(),
            known_hosts: "/etc/onramp/known_hosts".into(),
            connect_timeout: Duration::from_secs(10),
        }
    }

    /// The quoted string, parsed by a real POSIX shell, is the argv again.
    #[tokio::test]
    async fn remote_command_survives_a_real_shell() {
        let nasty = [
            "sacctmgr",
            "it's",
            "a b",
            "$(id)",
            "`id`",
            "x;rm -rf /",
            "\"q\"",
            "back\\slash",
            "new\nline",
            "",
            "*",
            "'",
            "''",
            "--",
            "-n",
            "ümlaut",
        ];
        let argv: Vec<String> = nasty.iter().map(|s| s.to_string()).collect();
        let script = format!("printf '%s\\0' {}", remote_command(&argv[1..]));
        let out = Local.run(&Command::new("sh").arg("-c").arg(script), Duration::from_secs(5)).await.unwrap();
        assert_eq!(out.code, 0, "{}", out.stderr);
        let back: Vec<&str> = out.stdout.split('\0').collect();
        assert_eq!(back[..back.len() - 1], nasty[1..]);
    }

    #[test]
    fn invocation_pins_everything_and_ends_with_one_quoted_command() {
        let ssh = Ssh::new(settings());
        let inv = ssh.invocation(&Command::new("sacctmgr").args(["-i", "add", "user", "it's"]));
        let argv = inv.argv();
        assert_eq!(argv[0], "ssh");
        for want in [
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            "UserKnownHostsFile=/etc/onramp/known_hosts",
            "GlobalKnownHostsFile=/dev/null",
            "IdentitiesOnly=yes",
        ] {
            assert!(argv.iter().any(|a| a == want), "{want} missing from {inv}");
        }
        let n = argv.len();
        assert_eq!(&argv[n - 3..], ["--", "ctl1.example.org", r"'sacctmgr' '-i' 'add' 'user' 'it'\''s'"]);
        assert!(argv.windows(2).any(|w| w == ["-i", "/run/secrets/onramp/ssh_key"]));
        assert!(argv.windows(2).any(|w| w == ["-p", "2222"]));
        assert!(argv.windows(2).any(|w| w == ["-l", "slurmadm"]));
    }

    #[test]
    fn ssh_failures_are_classified() {
        let out = |code, stderr: &str| Output { code, stdout: String::new(), stderr: stderr.into() };
        assert!(classify("h", out(0, "")).is_ok());
        assert_eq!(classify("h", out(1, "sacctmgr: error")).unwrap().code, 1);
        assert!(matches!(
            classify("h", out(255, "Host key verification failed.\r\n")),
            Err(TransportError::Permanent(m)) if m.contains("Host key verification failed")
        ));
        assert!(matches!(
            classify("h", out(255, "slurmadm@h: Permission denied (publickey).")),
            Err(TransportError::Permanent(_))
        ));
        assert!(matches!(
            classify("h", out(255, "ssh: connect to host h port 22: Connection refused")),
            Err(TransportError::Transient(_))
        ));
        assert_eq!(classify("h", out(255, "")).unwrap().code, 255);
    }
}

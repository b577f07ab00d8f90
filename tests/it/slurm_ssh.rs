//! The `ssh` Slurm route against a real OpenSSH server on loopback (scripts/test installs
//! openssh-server) standing in for a bare-metal controller: argv survives the remote shell, the
//! pinned host key is the only one trusted, and Slurm reads and writes over it match local ones.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use onramp::backends::exec::{Command, Local, Transport, TransportError};
use onramp::backends::slurm::{Slurm, SlurmCli};
use onramp::backends::ssh::{Ssh, SshSettings};
use onramp::domain::names::ClusterName;
use tokio::process::Child;

use crate::common::eventually;

const T: Duration = Duration::from_secs(30);

/// An sshd on a free loopback port that lets the current user in with one key.
struct Sshd {
    _child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

fn keygen(path: &Path) {
    let ok = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(path)
        .status()
        .unwrap()
        .success();
    assert!(ok, "ssh-keygen");
}

impl Sshd {
    async fn start() -> Self {
        let sshd = Path::new("/usr/sbin/sshd");
        assert!(sshd.exists(), "the ssh route's test needs openssh-server (scripts/test installs it)");
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        keygen(&d.join("host"));
        keygen(&d.join("client"));
        std::fs::copy(d.join("client.pub"), d.join("authorized_keys")).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/host\nAuthorizedKeysFile {d}/authorized_keys\n\
             PidFile {d}/sshd.pid\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
             StrictModes no\nPermitRootLogin prohibit-password\n",
            d = d.display()
        );
        std::fs::write(d.join("sshd_config"), config).unwrap();
        let host_pub = std::fs::read_to_string(d.join("host.pub")).unwrap();
        std::fs::write(d.join("known_hosts"), format!("[127.0.0.1]:{port} {host_pub}")).unwrap();
        // sshd run as root wants its privilege separation directory
        let _ = std::fs::create_dir_all("/run/sshd");
        let child = tokio::process::Command::new(sshd)
            .args(["-D", "-e", "-f"])
            .arg(d.join("sshd_config"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("start sshd");
        eventually(Duration::from_secs(20), "sshd to listen", || async {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(|_| ())
        })
        .await;
        Self { _child: child, dir, port }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn ssh(&self) -> Ssh {
        Ssh::new(SshSettings {
            host: "127.0.0.1".into(),
            user: None,
            port: self.port,
            key_file: self.path("client"),
            known_hosts: self.path("known_hosts"),
            connect_timeout: Duration::from_secs(10),
        })
    }
}

#[tokio::test]
async fn argv_crosses_the_remote_shell_intact_and_only_the_pinned_host_is_trusted() {
    let sshd = Sshd::start().await;
    let ssh = sshd.ssh();
    let nasty = ["it's", "a b", "$(id)", "`id`", "x;touch /tmp/onramp-pwned", "\"q\"", "back\\slash", "*", ""];
    let out = ssh.run(&Command::new("printf").arg("%s|").args(nasty), T).await.unwrap();
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, format!("{}|", nasty.join("|")));
    assert!(!Path::new("/tmp/onramp-pwned").exists());
    // the remote command's own exit code and output come back
    let out = ssh.run(&Command::new("sh").args(["-c", "echo err >&2; exit 7"]), T).await.unwrap();
    assert_eq!((out.code, out.stderr.as_str()), (7, "err\n"));

    // another host key pinned: refused, permanently, saying why
    let other = sshd.path("other");
    keygen(&other);
    let pinned = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    std::fs::write(sshd.path("known_hosts"), format!("[127.0.0.1]:{} {pinned}", sshd.port)).unwrap();
    let e = ssh.run(&Command::new("true"), T).await.unwrap_err();
    assert!(
        matches!(&e, TransportError::Permanent(m) if m.contains("REMOTE HOST IDENTIFICATION HAS CHANGED") || m.contains("Host key verification failed")),
        "{e:?}"
    );
    // no entry at all: refused too (BatchMode never asks)
    std::fs::write(sshd.path("known_hosts"), "").unwrap();
    let e = ssh.run(&Command::new("true"), T).await.unwrap_err();
    assert!(matches!(&e, TransportError::Permanent(m) if m.contains("Host key verification failed")), "{e:?}");
}

#[tokio::test]
async fn slurm_over_ssh_reads_and_writes_what_a_local_read_sees() {
    crate::slurm::cluster_up();
    let sshd = Sshd::start().await;
    let cluster = ClusterName::parse("production").unwrap();
    let gate = crate::slurm::writes();
    let remote = SlurmCli::new(Arc::new(sshd.ssh()), cluster.clone()).with_timeout(T).with_write_gate(gate.clone());
    let local = SlurmCli::new(Arc::new(Local), cluster).with_timeout(T).with_write_gate(gate);
    let config = remote.config().await.unwrap();
    assert_eq!(config.get("ClusterName").map(String::as_str), Some("production"));

    let name = crate::slurm::uniq("ssh");
    let spec = crate::slurm::tenant(&name, &[]);
    let account = spec.account.name.clone();
    remote.ensure_tenant(&spec).await.unwrap();
    let alice = [crate::slurm::user("onramp-alice")];
    remote.add_users(&account, &alice, false, &crate::slurm::user_limits()).await.unwrap();
    let seen = local.associations(std::slice::from_ref(&account)).await.unwrap();
    assert!(seen.iter().any(|a| a.user == "onramp-alice"), "a local read sees the remote write: {seen:?}");
    assert_eq!(remote.associations(std::slice::from_ref(&account)).await.unwrap(), seen);
    remote.delete_account(&account).await.unwrap();
    assert!(local.associations(std::slice::from_ref(&account)).await.unwrap().is_empty());
}

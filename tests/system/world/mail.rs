//! The real SMTP server of the world: `python3 -m aiosmtpd` (PyPI) delivering into a maildir.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use super::eventually;

pub struct Smtpd {
    pub port: u16,
    maildir: PathBuf,
    _child: Child,
}

impl Smtpd {
    pub async fn start(maildir: PathBuf, log: PathBuf) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("python3")
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
            .arg(&maildir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .kill_on_drop(true)
            .spawn()
            .expect("python3 with aiosmtpd (pip install aiosmtpd)");
        eventually(Duration::from_secs(20), "aiosmtpd to listen (pip install aiosmtpd)", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok().map(drop)
        })
        .await;
        Self { port, maildir, _child: child }
    }

    pub fn url(&self) -> String {
        format!("smtp://127.0.0.1:{}", self.port)
    }

    /// Every message received, as delivered (headers and body).
    pub fn messages(&self) -> Vec<String> {
        std::fs::read_dir(self.maildir.join("new"))
            .map(|d| d.flatten().filter_map(|e| std::fs::read_to_string(e.path()).ok()).collect())
            .unwrap_or_default()
    }
}

//! A PostgreSQL server of the world's own (`Options::own_postgres`), so a scenario can stop and
//! start it without touching the shared server other tests use: a cluster made with `initdb` in
//! the world's directory, run as the `postgres` unix user (PostgreSQL refuses root), listening
//! on a free port of 127.0.0.1 with trust auth, stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::Output;

/// How `pg_ctl stop` stops the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// Disconnects every client, rolls back their transactions, checkpoints: an operator's restart.
    Fast,
    /// Every process quits at once, as in a crash; the next start recovers from the WAL.
    Immediate,
}

impl Stop {
    fn mode(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Immediate => "immediate",
        }
    }
}

/// The unix user the server runs as.
const USER: &str = "postgres";

pub struct Server {
    /// The cluster's data directory (owned by `USER`).
    data: PathBuf,
    /// The server's own log.
    pub log: PathBuf,
    /// `initdb` and `pg_ctl` are here.
    bin: PathBuf,
    pub port: u16,
}

impl Server {
    /// `initdb` in `dir` (made and given to the server's user), then starts the server.
    pub async fn create(dir: &Path) -> Self {
        let bin = bin_dir();
        std::fs::create_dir_all(dir).unwrap();
        let chown = std::process::Command::new("chown").arg(USER).arg(dir).status().unwrap();
        assert!(chown.success(), "chown {USER} {}", dir.display());
        let data = dir.join("data");
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let s = Self { log: dir.join("server.log"), data, bin, port };
        let data = s.data.display().to_string();
        let args = ["-D", &data, "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-instructions"];
        let out = s.run("initdb", &args).await;
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        // only TCP on 127.0.0.1, and its socket in its own directory (not the shared server's)
        let conf = format!(
            "\n# the system test's world\nlisten_addresses = '127.0.0.1'\nport = {port}\n\
             unix_socket_directories = '{data}'\nmax_connections = 200\n"
        );
        let mut text = std::fs::read_to_string(s.data.join("postgresql.conf")).unwrap();
        text.push_str(&conf);
        std::fs::write(s.data.join("postgresql.conf"), text).unwrap();
        s.start().await;
        s
    }

    /// The URL of its `postgres` database as the superuser.
    pub fn admin_url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the server and waits until it accepts connections.
    pub async fn start(&self) {
        let log = self.log.display().to_string();
        let out = self.pg_ctl(&["-l", &log, "-w", "-t", "60", "start"]).await;
        assert!(out.status.success(), "pg_ctl start: {}\n{}", String::from_utf8_lossy(&out.stderr), self.tail());
    }

    /// Stops the server and waits until it is down.
    pub async fn stop(&self, how: Stop) {
        let out = self.pg_ctl(&["-m", how.mode(), "-w", "-t", "60", "stop"]).await;
        assert!(out.status.success(), "pg_ctl stop: {}\n{}", String::from_utf8_lossy(&out.stderr), self.tail());
    }

    /// Stops the server at once, without waiting for the runtime (for `Drop`).
    pub fn stop_now(&self) {
        if self.data.join("postmaster.pid").exists() {
            let _ = self.command("pg_ctl").args(self.ctl_args(&["-m", "immediate", "-w", "stop"])).output();
        }
    }

    fn tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(10)..].join("\n")
    }

    fn ctl_args(&self, args: &[&str]) -> Vec<String> {
        let mut all = vec!["-D".to_string(), self.data.display().to_string()];
        all.extend(args.iter().map(|a| a.to_string()));
        all
    }

    async fn pg_ctl(&self, args: &[&str]) -> Output {
        let args = self.ctl_args(args);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.run("pg_ctl", &args).await
    }

    async fn run(&self, program: &str, args: &[&str]) -> Output {
        let mut c = tokio::process::Command::from(self.command(program));
        c.args(args).output().await.unwrap_or_else(|e| panic!("running {program}: {e}"))
    }

    /// `program` run as the server's user: `runuser -u postgres -- <bin>/<program>`.
    fn command(&self, program: &str) -> std::process::Command {
        let mut c = std::process::Command::new("runuser");
        c.args(["-u", USER, "--"]).arg(self.bin.join(program));
        // the server's user may not enter the test's working directory; its own process group
        // keeps a Ctrl-C of the test run from reaching the server before the test stops it
        std::os::unix::process::CommandExt::process_group(c.current_dir("/"), 0);
        c
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Where `initdb` and `pg_ctl` are: as `onramp dev` finds them for its own PostgreSQL.
fn bin_dir() -> PathBuf {
    onramp::app::devpg::find_bin().unwrap_or_else(|e| panic!("{e:#}"))
}

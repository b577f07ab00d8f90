//! A private PostgreSQL for `onramp dev`: initdb/pg_ctl from PATH or /usr/lib/postgresql/*/bin,
//! a data directory of its own, listening on 127.0.0.1 only.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use tokio::process::Command;

use crate::domain::secret::Secret;

pub struct PrivatePg {
    data: PathBuf,
    bin: PathBuf,
    /// When running as root: the unprivileged user the server runs as (PostgreSQL refuses root).
    run_as: Option<String>,
    pub url: Secret,
}

const INSTALL_HINT: &str = "install the PostgreSQL server (Debian/Ubuntu: apt-get install postgresql; \
     Fedora: dnf install postgresql-server; macOS: brew install postgresql), or run onramp serve against an existing database";

/// The directory holding `initdb` and `pg_ctl`.
pub fn find_bin() -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return Ok(dir);
            }
        }
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .map(|(_, b)| b)
        .with_context(|| format!("no initdb/pg_ctl found in PATH or /usr/lib/postgresql/*/bin: {INSTALL_HINT}"))
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
        .unwrap_or(false)
}

/// Where the data lives when the server runs as `user` (onramp runs as root): PostgreSQL refuses
/// root, and `user` often cannot reach the dev folder (root's home is mode 0700 in most
/// containers). So the data goes to /var/tmp/onramp-dev-<hash of the dev folder>, owned by `user`,
/// mode 0700, and the next start from the same folder finds it again.
async fn shared_home(dev_dir: &Path, user: &str) -> anyhow::Result<PathBuf> {
    use sha2::Digest;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let hash = sha2::Sha256::digest(dev_dir.as_os_str().as_encoded_bytes());
    let hex: String = hash.iter().take(6).map(|b| format!("{b:02x}")).collect();
    let home = PathBuf::from(format!("/var/tmp/onramp-dev-{hex}"));
    let out = Command::new("id").args(["-u", user]).output().await.context("running id")?;
    let Some(uid) = String::from_utf8_lossy(&out.stdout).trim().parse::<u32>().ok().filter(|_| out.status.success())
    else {
        bail!("running as root, and the user {user:?} (to run PostgreSQL as) is missing: {INSTALL_HINT}");
    };
    match std::fs::symlink_metadata(&home) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir(&home).with_context(|| format!("creating {}", home.display()))?;
            std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700))?;
            let ok = Command::new("chown").arg(user).arg(&home).status().await?.success();
            anyhow::ensure!(ok, "cannot give {} to the user {user:?}", home.display());
        }
        Err(e) => return Err(e).with_context(|| format!("looking at {}", home.display())),
        // someone else's directory (or a link) at that name is not used
        Ok(m) if !m.is_dir() || m.uid() != uid => bail!(
            "{} is not a directory of the user {user:?}: remove it, or run onramp dev as a user other than root",
            home.display()
        ),
        Ok(_) => {}
    }
    Ok(home)
}

impl PrivatePg {
    /// Initializes the data directory on first use, then starts the server (or adopts the one
    /// already running there).
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let bin = find_bin()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let run_as = is_root().then(|| "postgres".to_string());
        let data = match &run_as {
            None => dir.join("postgres"),
            Some(user) => shared_home(&dir, user).await?.join("postgres"),
        };
        let mut pg = Self { data, bin, run_as, url: Secret::new("") };
        if !pg.data.join("PG_VERSION").exists() {
            pg.init().await?;
        }
        let port: u16 = std::fs::read_to_string(pg.data.join("onramp-port"))
            .context("reading the private server's port")?
            .trim()
            .parse()
            .context("the private server's port file is damaged")?;
        if !pg.pg_ctl(&["status"]).await.is_ok_and(|o| o.status.success()) {
            let log = pg.data.join("server.log");
            let log = log.to_string_lossy();
            let out = pg.pg_ctl(&["-l", &log, "-w", "-t", "60", "start"]).await?;
            if !out.status.success() {
                bail!(
                    "the private PostgreSQL did not start (see {log}): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
        pg.url = Secret::new(format!("postgres://onramp@127.0.0.1:{port}/postgres"));
        Ok(pg)
    }

    async fn init(&self) -> anyhow::Result<()> {
        std::fs::create_dir_all(&self.data)?;
        if let Some(user) = &self.run_as {
            let ok = Command::new("chown").arg("-R").arg(user).arg(&self.data).status().await?.success();
            if !ok {
                bail!("running as root, and the user {user:?} (to run PostgreSQL as) is missing: {INSTALL_HINT}");
            }
        }
        let data = self.data.to_string_lossy();
        let out = self
            .command("initdb", &["-D", &data, "-U", "onramp", "--auth=trust", "-E", "UTF8", "--no-instructions"])
            .output()
            .await
            .context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let conf = format!(
            "\n# onramp dev\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{data}'\n"
        );
        let mut text = std::fs::read_to_string(self.data.join("postgresql.conf"))?;
        text.push_str(&conf);
        std::fs::write(self.data.join("postgresql.conf"), text)?;
        std::fs::write(self.data.join("onramp-port"), port.to_string())?;
        Ok(())
    }

    fn command(&self, program: &str, args: &[&str]) -> Command {
        let exe = self.bin.join(program);
        let mut c = match &self.run_as {
            Some(user) => {
                let mut c = Command::new("runuser");
                c.args(["-u", user, "--"]).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        if self.run_as.is_some() {
            // the server's user may not be allowed into the current directory
            c.current_dir("/");
        }
        // its own process group: Ctrl-C in the terminal reaches onramp, which then stops the server in order
        c.args(args).process_group(0);
        c
    }

    async fn pg_ctl(&self, args: &[&str]) -> anyhow::Result<std::process::Output> {
        let data = self.data.to_string_lossy();
        let mut all = vec!["-D", &data];
        all.extend_from_slice(args);
        self.command("pg_ctl", &all).output().await.context("running pg_ctl")
    }

    pub async fn stop(&self) -> anyhow::Result<()> {
        let out = self.pg_ctl(&["-m", "fast", "-w", "stop"]).await?;
        if !out.status.success() {
            bail!("stopping the private PostgreSQL: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
        Ok(())
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }
}

//! `onramp dev`: the real intake, reconciler and flows on the simulated cluster, as a user of the
//! README's first command sees them: on its own private PostgreSQL, whatever DATABASE_URL says.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::common::{TestDb, eventually};

/// A running `onramp dev`: its output lines as they come, the process stopped when dropped.
struct Dev {
    child: KillOnDrop,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Dev {
    /// Starts dev in `folder` (its `.onramp-dev` there), with `DATABASE_URL` naming `other_db`.
    fn start(folder: &Path, other_db: &str) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_onramp"))
            .args(["dev", "--listen", "127.0.0.1:0", "--poll-interval", "1s"])
            .current_dir(folder)
            .env("DATABASE_URL", other_db)
            .env("ONRAMP_LOG", "warn")
            .env_remove("ONRAMP_CONFIG")
            .env_remove("ONRAMP_DEV_DIR")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(Some(child));
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let out = BufReader::new(child.0.as_mut().unwrap().stdout.take().unwrap());
        let err = BufReader::new(child.0.as_mut().unwrap().stderr.take().unwrap());
        for stream in [Box::new(out) as Box<dyn BufRead + Send>, Box::new(err)] {
            let seen = lines.clone();
            std::thread::spawn(move || stream.lines().map_while(Result::ok).for_each(|l| seen.lock().unwrap().push(l)));
        }
        Self { child, lines }
    }

    /// The rest of the first line starting with `prefix` (after spaces).
    fn find(&self, prefix: &str) -> Option<String> {
        let l = self.lines.lock().unwrap();
        l.iter().find_map(|l| l.trim().strip_prefix(prefix).map(|r| r.trim().to_string()))
    }

    /// SIGTERM: a clean stop.
    async fn stop(mut self) {
        let mut child = self.child.0.take().unwrap();
        let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
        let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
        assert!(status.success(), "{status:?}");
    }
}

/// The CLI run in `cwd` with only PATH (and `env`) in its environment.
fn cli(cwd: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_onramp"));
    c.args(args).current_dir(cwd).env_clear().env("PATH", std::env::var("PATH").unwrap_or_default());
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

/// As a newcomer starts it: from a folder of mode 0700 (as root, root's home in most containers,
/// which the `postgres` user cannot enter), with the default `.onramp-dev`, then the CLI with no
/// flags in that folder, and with the banner's `export` line elsewhere.
#[tokio::test]
async fn dev_onboards_and_offboards_on_the_simulated_cluster() {
    // A database of someone's real onramp, named by DATABASE_URL: dev must leave it alone.
    let db = TestDb::bare().await;
    let home = tempfile::tempdir().unwrap();
    std::fs::set_permissions(home.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let dev = Dev::start(home.path(), &db.url);
    let base =
        eventually(Duration::from_secs(60), "dev to start", || async { dev.find("onramp dev is running at ") }).await;
    let token = dev.find("API token:").expect("the token is printed");
    let database = dev.find("database:").expect("the database URL is printed");
    let data = dev.find("data:").expect("the data directory is printed");
    let data = PathBuf::from(data.split(' ').next().unwrap());
    let registry = dev.find("registry:").expect("the registry is printed");
    let registry = registry.split(' ').next().unwrap().to_string();
    assert!(database.starts_with("postgres://onramp@127.0.0.1:"), "{database}");
    assert!(data.join("PG_VERSION").is_file(), "{data:?}");
    assert!(std::fs::read_to_string(&registry).unwrap().contains("name: demo"), "{registry}");
    let export = dev.find("export ").expect("an export line");
    assert_eq!(export, format!("DATABASE_URL={database} ONRAMP_TENANTS={registry}"));
    assert!(dev.find("onramp dev: ignoring DATABASE_URL").is_some(), "dev says it ignores DATABASE_URL");
    let http = reqwest::Client::new();
    let jobs = |kind: &'static str| {
        let (http, base, token) = (http.clone(), base.clone(), token.clone());
        async move {
            let r = http.get(format!("{base}/v1/jobs?kind={kind}")).bearer_auth(&token).send().await.unwrap();
            let v: Value = r.json().await.unwrap();
            v["jobs"].as_array().cloned().unwrap_or_default()
        }
    };

    // The webhook went through the real intake.
    eventually(Duration::from_secs(30), "the sample webhook", || async {
        dev.find("[dev] sample webhook (alice updated) answered").filter(|s| s == "202")
    })
    .await;
    // alice and bob onboarded, their associations in one batched command.
    let done = eventually(Duration::from_secs(90), "two onboardings to succeed", || async {
        let j = jobs("user.onboard").await;
        (j.len() == 2 && j.iter().all(|j| j["state"] == "succeeded")).then_some(j)
    })
    .await;
    let subjects: Vec<&str> = done.iter().filter_map(|j| j["subject"].as_str()).collect();
    assert!(subjects.contains(&"demo/alice") && subjects.contains(&"demo/bob"), "{subjects:?}");
    // every simulated call is printed (shortly after it happens)
    let printed = |want: &'static str| {
        let lines = dev.lines.clone();
        eventually(Duration::from_secs(10), want, move || {
            let l = lines.lock().unwrap().clone();
            async move { l.iter().any(|l| l.starts_with(want)).then_some(()) }
        })
    };
    printed("[dry-run] + slurm          sacctmgr -i add user alice,bob Account=ml-team-demo").await;
    printed("[dry-run] + login/tenant-demo mv -T -- /home/.onramp-new-alice /home/alice").await;
    // dave, who left the group: blocked, deactivated, now in the retention wait.
    let off = eventually(Duration::from_secs(60), "dave's offboarding to reach retention", || async {
        jobs("user.offboard").await.into_iter().find(|j| j["step"] == "retention" && j["state"] == "waiting")
    })
    .await;
    assert_eq!(off["subject"], "demo/dave");
    printed("[dry-run] + slurm          sacctmgr -i modify user where name=dave account=tenant-demo cluster=dev set MaxJobs=0").await;

    // The CLI, with no flags: in the dev folder and below it, it finds dev by itself …
    let below = home.path().join("src");
    std::fs::create_dir(&below).unwrap();
    let o = cli(&below, &["jobs", "list", "--json"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    let offboard = listed["jobs"].as_array().unwrap().iter().find(|j| j["subject"] == "demo/dave").unwrap().clone();
    assert_eq!(offboard["kind"], "user.offboard");
    let o = cli(home.path(), &["plan", "user.onboard", "--tenant", "demo", "--user", "carol"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("sacctmgr -i add user carol"), "{o:?}");
    // … and anywhere after the banner's export line
    let exported = [("DATABASE_URL", database.as_str()), ("ONRAMP_TENANTS", registry.as_str())];
    let o = cli(Path::new("/"), &["jobs", "show", &offboard["id"].to_string()], &exported);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with(&format!("job {} · user.offboard · demo/dave", offboard["id"]))
    );
    let o = cli(Path::new("/"), &["plan", "tenant.onboard", "--tenant", "demo"], &exported);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    dev.stop().await;
    // DATABASE_URL's database was never touched: not migrated, no token, no jobs.
    let tables: i64 = sqlx::query_scalar("select count(*) from pg_tables where schemaname = 'public'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "onramp dev migrated the database of DATABASE_URL");
    // a stopped dev is not found
    let o = cli(home.path(), &["jobs", "list"], &[]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("missing setting: --database-url"), "{o:?}");

    // The next start from the same folder finds the same data again: the jobs are still there.
    let dev = Dev::start(home.path(), &db.url);
    eventually(Duration::from_secs(60), "dev to start again", || async { dev.find("onramp dev is running at ") }).await;
    assert_eq!(dev.find("data:").unwrap().split(' ').next(), Some(data.to_str().unwrap()));
    let o = cli(home.path(), &["jobs", "show", &offboard["id"].to_string(), "--json"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    dev.stop().await;
    // as root the data lives outside the dev folder (for the postgres user to reach it)
    if !data.starts_with(home.path()) {
        std::fs::remove_dir_all(data.parent().unwrap()).unwrap();
    }
}

#[test]
fn dev_has_no_database_option() {
    let out = Command::new(env!("CARGO_BIN_EXE_onramp"))
        .args(["dev", "--database-url", "postgres://elsewhere/onramp"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--database-url"), "{out:?}");
}

/// Stops the process when the test ends early (a failed assertion).
struct KillOnDrop(Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

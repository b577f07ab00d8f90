//! `onramp dev`: the real intake, reconciler and flows on the simulated cluster, as a user of the
//! README's first command sees them: on its own private PostgreSQL, whatever DATABASE_URL says.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use crate::common::{TestDb, eventually};

#[tokio::test]
async fn dev_onboards_and_offboards_on_the_simulated_cluster() {
    // A database of someone's real onramp, named by DATABASE_URL: dev must leave it alone.
    let db = TestDb::bare().await;
    let home = tempfile::tempdir().unwrap();
    // as root, the private PostgreSQL runs as `postgres`, which must reach its data directory
    std::fs::set_permissions(home.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let dev_dir = home.path().join("dev");
    let child = Command::new(env!("CARGO_BIN_EXE_onramp"))
        .args(["dev", "--listen", "127.0.0.1:0", "--poll-interval", "1s"])
        .arg("--dev-dir")
        .arg(&dev_dir)
        .env("DATABASE_URL", &db.url)
        .env("ONRAMP_LOG", "warn")
        .env_remove("ONRAMP_CONFIG")
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
    let find = |prefix: &str| {
        let l = lines.lock().unwrap();
        l.iter().find_map(|l| l.trim().strip_prefix(prefix).map(|r| r.trim().to_string()))
    };
    let base =
        eventually(Duration::from_secs(30), "dev to start", || async { find("onramp dev is running at ") }).await;
    let token = find("API token:").expect("the token is printed");
    let database = find("database:").expect("the database is named");
    assert!(database.contains(&dev_dir.display().to_string()), "{database}");
    assert!(find("onramp dev: ignoring DATABASE_URL").is_some(), "dev says it ignores DATABASE_URL");
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
        find("[dev] sample webhook (alice updated) answered").filter(|s| s == "202")
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
        let lines = lines.clone();
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

    // SIGTERM: a clean stop.
    let mut child = child.0.take().unwrap();
    let _ = Command::new("kill").arg("-TERM").arg(child.id().to_string()).status();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status:?}");
    // DATABASE_URL's database was never touched: not migrated, no token, no jobs.
    let tables: i64 = sqlx::query_scalar("select count(*) from pg_tables where schemaname = 'public'")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(tables, 0, "onramp dev migrated the database of DATABASE_URL");
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

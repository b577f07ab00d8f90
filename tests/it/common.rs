//! Test helpers: a fresh database per test (dropped afterwards), polling with deadlines,
//! workers in the test process and `onramp` child processes.

use std::future::Future;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use onramp::engine::{Engine, Job, Registry, StepRun, WorkerConfig, WorkerStats};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The server tests create their databases on (trust auth, a role allowed to create databases).
pub fn admin_url() -> String {
    std::env::var("ONRAMP_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub struct TestDb {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
}

impl TestDb {
    pub async fn new() -> Self {
        let db = Self::bare().await;
        onramp::app::db::migrate(&db.pool).await.unwrap();
        db
    }

    /// An empty database, not migrated.
    pub async fn bare() -> Self {
        let admin = admin_url();
        let name = format!("onramp_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| panic!("tests need PostgreSQL at {admin} (ONRAMP_TEST_DATABASE_URL): {e}"));
        sqlx::query(&format!("create database {name}")).execute(&mut conn).await.unwrap();
        let url = match admin.rsplit_once('/') {
            Some((base, _)) => format!("{base}/{name}"),
            None => panic!("ONRAMP_TEST_DATABASE_URL must name a database"),
        };
        let pool = PgPoolOptions::new().max_connections(20).connect(&url).await.unwrap();
        Self { name, url, pool }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let name = self.name.clone();
        // Drop runs inside the test's runtime: use a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Ok(mut c) = PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await;
                }
            });
        })
        .join();
    }
}

/// Polls `check` until it returns Some, or panics with `what` after `deadline`.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    match poll_until(deadline, check).await {
        Some(v) => v,
        None => panic!("timed out after {deadline:?} waiting for {what}"),
    }
}

/// Polls `check` until it returns Some; None once `deadline` has passed.
pub async fn poll_until<T, F, Fut>(deadline: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let end = tokio::time::Instant::now() + deadline;
    loop {
        if let Some(v) = check().await {
            return Some(v);
        }
        if tokio::time::Instant::now() > end {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Polls job `id` until it is in `state`; on timeout the panic shows where the job is instead
/// (its state, step, attempt, last error and its latest step runs), so a slow or stuck job can
/// be told apart from a failed one.
pub async fn wait_state(engine: &Engine, id: i64, state: &str, deadline: Duration) -> Job {
    let reached = poll_until(deadline, || async {
        let j = engine.job(id).await.unwrap();
        (j.state.as_str() == state).then_some(j)
    })
    .await;
    if let Some(j) = reached {
        return j;
    }
    let j = engine.job(id).await.unwrap();
    let runs = engine.step_runs(id).await.unwrap_or_default();
    let recent: Vec<String> =
        runs.iter().rev().take(5).map(|r| format!("{}#{} {:?} {:?}", r.step, r.attempt, r.outcome, r.error)).collect();
    panic!(
        "timed out after {deadline:?} waiting for job {id} ({}) to be {state}: it is {} at step {} \
         (attempt {}, run at {}), last error {:?}; latest step runs: {recent:?}",
        j.kind,
        j.state.as_str(),
        j.step,
        j.attempt,
        j.run_at,
        j.last_error
    );
}

pub async fn runs(engine: &Engine, id: i64) -> Vec<StepRun> {
    engine.step_runs(id).await.unwrap()
}

pub fn worker_config(id: &str, lease: Duration) -> WorkerConfig {
    WorkerConfig {
        id: id.into(),
        concurrency: 16,
        lease,
        poll_interval: Duration::from_secs(1),
        shutdown_grace: Duration::from_secs(5),
    }
}

/// A worker inside the test process.
pub struct TestWorker {
    pub stop: CancellationToken,
    pub handle: JoinHandle<()>,
}

impl TestWorker {
    pub fn start(engine: &Engine, cfg: WorkerConfig) -> Self {
        let stop = CancellationToken::new();
        let stats = Arc::new(WorkerStats::default());
        let (e, st, s) = (engine.clone(), stats, stop.clone());
        let handle = tokio::spawn(async move { e.run_worker(cfg, st, s).await.unwrap() });
        Self { stop, handle }
    }

    pub async fn shutdown(self) {
        self.stop.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.handle).await.expect("worker stops").unwrap();
    }
}

pub fn engine(db: &TestDb, registry: Registry) -> Engine {
    Engine::new(db.pool.clone(), registry)
}

/// `onramp serve --role worker` as a child process against the test database.
pub fn spawn_worker_process(db: &TestDb, id: &str, lease: &str, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_onramp"))
        .args(["serve", "--role", "worker", "--worker-id", id, "--lease", lease, "--poll-interval", "1s"])
        .args(extra)
        .env("DATABASE_URL", &db.url)
        .env("ONRAMP_LOG", "warn")
        // several on one host: each its own health and metrics port
        .env("ONRAMP_WORKER_LISTEN", "127.0.0.1:0")
        .env_remove("ONRAMP_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn onramp")
}

/// Waits until the worker process has its LISTEN connection up (it is then ready to claim).
pub async fn wait_listening(db: &TestDb, processes: i64) {
    eventually(Duration::from_secs(20), "worker processes to LISTEN", || async {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity where datname = current_database() and query ilike 'listen%'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        (n >= processes).then_some(())
    })
    .await
}

pub fn signal(child: &Child, sig: &str) {
    let pid = child.id().expect("child is running").to_string();
    let ok = std::process::Command::new("kill").args([sig, &pid]).status().unwrap().success();
    assert!(ok, "kill {sig} {pid}");
}

/// Runs one test of this binary again in a process of its own (`args` are more of the test
/// harness's flags, `env` is set for that process) and fails unless it ran and passed: for tests
/// that must be alone in their process, such as those that set tracing subscribers (tracing caches
/// per call site, process-wide, whether anyone listens).
pub async fn run_in_own_process(test: &str, args: &[&str], env: &[(&str, &str)]) {
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .await
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{test} in its own process failed:\n{said}");
    assert!(said.contains("1 passed"), "{test} did not run in its own process:\n{said}");
}

pub async fn db_now(pool: &PgPool) -> time::OffsetDateTime {
    sqlx::query_scalar("select now()").fetch_one(pool).await.unwrap()
}

/// The fake `weka`/`lfs`/`lctl` (`onramp-fakes` under those names, keeping its state beside the
/// links) installed in `dir` as each of `names`. The binary is `$ONRAMP_FAKES_BIN` (scripts/test
/// sets it), else built once with cargo.
pub fn install_storage_cli(dir: &std::path::Path, names: &[&str]) {
    static BIN: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let bin = BIN.get_or_init(|| {
        crate::cargo_bin::binary("ONRAMP_FAKES_BIN", "onramp-fakes", &["-p", "onramp-fakes", "--bin", "onramp-fakes"])
    });
    for name in names {
        std::os::unix::fs::symlink(bin, dir.join(name)).unwrap();
    }
}

//! The engine's speed, measured the way bench/reference measures graphile-worker and pgbench on
//! the same PostgreSQL: `cargo bench --bench engine` (settings below, from the environment).
//!
//! - throughput: N no-op jobs enqueued up front (`BENCH_JOBS`, 100,000: as many as bench/reference
//!   drains graphile-worker with), then workers started; seconds until all succeeded. Two drains:
//!   each job its own subject (none waits for another: graphile-worker's reference jobs have no
//!   queue), then the jobs spread over 1,000 subjects (fewer in a short drain), each subject's
//!   jobs one at a time, oldest first (what onramp's flows ask of it). `BENCH_SUBJECTS=N` runs one
//!   drain over N subjects.
//! - latency: an idle worker, jobs enqueued one at a time at a fixed rate; enqueue call -> step start
//! - recovery: an `onramp` worker process killed with SIGKILL mid-step; kill -> step claimed again
//!
//! Prints one JSON line per measurement.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onramp::engine::{
    Actor, Engine, Flow, NewJob, Registry, StepCtx, StepFuture, Transition, WorkerConfig, WorkerStats,
};
use serde_json::json;
use sqlx::{Connection, PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// One step that does nothing, or notes when it started (for latency).
struct Noop {
    starts: Arc<Mutex<Vec<(i64, Instant)>>>,
}

impl Flow for Noop {
    fn kind(&self) -> &'static str {
        "bench.noop"
    }
    fn steps(&self) -> &'static [&'static str] {
        &["noop"]
    }
    fn run<'a>(&'a self, _: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        if ctx.input.get("t").is_some() {
            self.starts.lock().unwrap().push((ctx.job_id, Instant::now()));
        }
        Box::pin(async { Transition::Done(serde_json::Value::Null) })
    }
}

async fn fresh_db(admin: &str, name: &str) -> (String, PgPool) {
    let mut c = PgConnection::connect(admin).await.expect("BENCH_PG reachable");
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await.unwrap();
    sqlx::query(&format!("create database {name}")).execute(&mut c).await.unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);
    let pool = onramp::app::db::pool_options(16).connect(&url).await.unwrap();
    onramp::app::db::migrate(&pool).await.unwrap();
    // BENCH_SETUP_SQL: statements run after the migrations, for A/B experiments on the schema
    // (bench/wal-profile.sh: e.g. what the drain costs with an index fewer) without a rebuild
    if let Ok(sql) = std::env::var("BENCH_SETUP_SQL") {
        sqlx::raw_sql(&sql).execute(&pool).await.expect("BENCH_SETUP_SQL runs");
    }
    (url, pool)
}

async fn drop_db(admin: &str, name: &str) {
    let mut c = PgConnection::connect(admin).await.unwrap();
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await.unwrap();
}

fn config(id: &str, concurrency: usize) -> WorkerConfig {
    WorkerConfig {
        id: id.into(),
        concurrency,
        lease: Duration::from_secs(10),
        poll_interval: Duration::from_secs(5),
        shutdown_grace: Duration::from_secs(10),
    }
}

fn start_workers(
    engine: &Engine,
    n: usize,
    concurrency: usize,
) -> (CancellationToken, Vec<tokio::task::JoinHandle<()>>) {
    let stop = CancellationToken::new();
    let handles = (0..n)
        .map(|i| {
            let (e, s) = (engine.clone(), stop.clone());
            let cfg = config(&format!("bench-{i}"), concurrency);
            tokio::spawn(async move { e.run_worker(cfg, Arc::new(WorkerStats::default()), s).await.unwrap() })
        })
        .collect();
    (stop, handles)
}

/// Whether any job is unfinished: the first entry of the open-jobs index, as graphile-worker's
/// bench asks whether any row is left (a `count(*)` every few ms took a third of a core from the
/// engine it was timing).
async fn any_open(pool: &PgPool) -> bool {
    sqlx::query_scalar("select exists (select 1 from jobs where state not in ('succeeded', 'cancelled'))")
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn wal_lsn(pool: &PgPool) -> String {
    sqlx::query_scalar("select pg_current_wal_lsn()::text").fetch_one(pool).await.unwrap()
}

async fn throughput(admin: &str, jobs: usize, subjects: usize) {
    let workers: usize = env("BENCH_WORKERS", 2);
    // slots a worker: `onramp worker`'s default (--worker-concurrency 512), about as many jobs as
    // each graphile-worker process of the batched reference holds (localQueue size 500)
    let concurrency: usize = env("BENCH_CONCURRENCY", 512);
    let (_, pool) = fresh_db(admin, "onramp_bench_throughput").await;
    let engine = Engine::new(pool.clone(), Registry::new().with(Noop { starts: Arc::default() }));
    // jobs spread over the subjects in turn (one subject's jobs run one at a time, oldest first)
    for b in 0..jobs / 1000 {
        let batch: Vec<NewJob> = (0..1000)
            .map(|i| {
                let s = (b * 1000 + i) % subjects;
                NewJob::new("bench.noop", &format!("s/{s}"), json!({}), Actor::cli("bench"))
            })
            .collect();
        engine.enqueue(&batch).await.unwrap();
    }
    // WAL written while draining (the whole server's; nothing else should run): what a job costs on disk
    let lsn0 = wal_lsn(&pool).await;
    let t0 = Instant::now();
    let (stop, handles) = start_workers(&engine, workers, concurrency);
    // polled as often as graphile-worker's bench polls its queue (20 ms)
    while any_open(&pool).await {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = t0.elapsed().as_secs_f64();
    let lsn1 = wal_lsn(&pool).await;
    let wal: f64 = sqlx::query_scalar("select pg_wal_lsn_diff($1::pg_lsn, $2::pg_lsn)::float8")
        .bind(&lsn1)
        .bind(&lsn0)
        .fetch_one(&pool)
        .await
        .unwrap();
    stop.cancel();
    for h in handles {
        h.await.unwrap();
    }
    let done = (jobs / 1000) * 1000;
    println!(
        "{}",
        json!({"system": "onramp", "measure": "throughput", "jobs": done, "subjects": subjects.min(done), "workers": workers,
               "concurrency": concurrency, "seconds": secs, "jobs_per_s": done as f64 / secs,
               "wal_bytes_per_job": (wal / done as f64).round(), "wal_from": lsn0, "wal_to": lsn1})
    );
    drop_db(admin, "onramp_bench_throughput").await;
}

async fn latency(admin: &str) {
    let rate: u64 = env("BENCH_RATE", 200);
    let seconds: u64 = env("BENCH_SECONDS", 10);
    let (_, pool) = fresh_db(admin, "onramp_bench_latency").await;
    let starts = Arc::new(Mutex::new(Vec::new()));
    let engine = Engine::new(pool.clone(), Registry::new().with(Noop { starts: starts.clone() }));
    let (stop, handles) = start_workers(&engine, 1, 32);
    tokio::time::sleep(Duration::from_millis(300)).await; // let the worker LISTEN before measuring
    let mut enqueued = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / rate));
    for i in 0..rate * seconds {
        tick.tick().await;
        let t = Instant::now();
        let job = NewJob::new("bench.noop", &format!("s/{i}"), json!({"t": 1}), Actor::cli("bench"));
        let id = engine.enqueue(&[job]).await.unwrap()[0].id;
        enqueued.push((id, t));
    }
    // polled as often as graphile-worker's bench polls its queue (20 ms)
    while any_open(&pool).await {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    for h in handles {
        h.await.unwrap();
    }
    let starts: std::collections::HashMap<i64, Instant> = starts.lock().unwrap().iter().copied().collect();
    let mut ms: Vec<f64> = enqueued.iter().map(|(id, t)| (starts[id] - *t).as_secs_f64() * 1000.0).collect();
    ms.sort_by(f64::total_cmp);
    let pct = |p: f64| ms[((ms.len() as f64 * p) as usize).min(ms.len() - 1)];
    println!(
        "{}",
        json!({"system": "onramp", "measure": "enqueue_to_start", "jobs": ms.len(), "rate_per_s": rate,
               "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": ms[ms.len() - 1]})
    );
    drop_db(admin, "onramp_bench_latency").await;
}

async fn recovery(admin: &str) {
    let lease = "2s";
    let (url, pool) = fresh_db(admin, "onramp_bench_recovery").await;
    let engine = Engine::new(pool.clone(), onramp::flows::registry());
    let exe = std::env::var("BENCH_ONRAMP").unwrap_or_else(|_| "target/release/onramp".into());
    let spawn = |id: &str| {
        tokio::process::Command::new(&exe)
            .args(["serve", "--role", "worker", "--worker-id", id, "--lease", lease])
            .env("DATABASE_URL", &url)
            .env("ONRAMP_LOG", "error")
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("{exe}: {e} (build it: cargo build --release)"))
    };
    let mut victim = spawn("victim");
    let job = NewJob::new("selftest", "s/1", json!({"block_attempts": 1}), Actor::cli("bench"));
    let id = engine.enqueue(&[job]).await.unwrap()[0].id;
    loop {
        let j = engine.job(id).await.unwrap();
        if j.state.as_str() == "running" && j.step == "work" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    victim.kill().await.unwrap();
    let killed: time::OffsetDateTime = sqlx::query_scalar("select now()").fetch_one(&pool).await.unwrap();
    let _rescuer = spawn("rescuer");
    let started = loop {
        let r = engine.step_runs(id).await.unwrap();
        if let Some(run) = r.iter().find(|r| r.step == "work" && r.worker == "rescuer") {
            break run.started_at;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let ms = (started - killed).whole_milliseconds();
    println!(
        "{}",
        json!({"system": "onramp", "measure": "kill9_recovery", "lease_ms": 2000, "recovered_ms": ms,
               "ratio_to_lease": ms as f64 / 2000.0})
    );
    drop(_rescuer);
    drop_db(admin, "onramp_bench_recovery").await;
}

#[tokio::main]
async fn main() {
    let admin = std::env::var("BENCH_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let which = std::env::var("BENCH_ONLY").unwrap_or_default();
    if which.is_empty() || which == "throughput" {
        let jobs: usize = env("BENCH_JOBS", 100_000);
        match std::env::var("BENCH_SUBJECTS").ok().and_then(|v| v.parse().ok()) {
            Some(n) => throughput(&admin, jobs, n).await,
            None => {
                throughput(&admin, jobs, usize::MAX).await;
                // 1,000 at 100,000 jobs; in a short drain (the smoke) still 100 jobs a subject
                throughput(&admin, jobs, (jobs / 100).clamp(1, 1000)).await;
            }
        }
    }
    if which.is_empty() || which == "latency" {
        latency(&admin).await;
    }
    if which.is_empty() || which == "recovery" {
        recovery(&admin).await;
    }
}

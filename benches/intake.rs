//! Webhook intake speed and memory: `onramp serve --role api` (release build) with the Authentik
//! intake on. Three figures, each checked before it is printed:
//!
//! 1. **intake**: 32 clients post signed Standard Webhooks deliveries (each a distinct Authentik
//!    event about a different user) for 20 s; deliveries/s and the answer's p50/p99. Each is
//!    stored before its 202; the pump (in the same process) makes its reconcile job. Checked:
//!    every acknowledged delivery stored once, processed, and its user's reconcile job exists.
//!    Compare with bench/reference (pgbench single-row INSERT at 32 clients, same PostgreSQL).
//! 2. **event storm**: 10,000 deliveries about one group, sent as fast as 32 clients go (the
//!    target is within 10 s); all acknowledged, and the count of reconcile jobs for that group's
//!    tenant (target ≤ 2). The api role runs no worker, so none of them starts during the storm.
//! 3. **RSS** of the `onramp serve` process: idle (ready, before any load) and peak during the
//!    intake figure (VmRSS sampled every 20 ms from /proc/<pid>/status; VmHWM at the end).
//!
//!   cargo build --release && cargo bench --bench intake
//!   ONRAMP_BENCH_SMOKE=1 cargo bench --bench intake     # seconds: 2 s of intake, a storm of 500
//!
//! Settings: BENCH_PG (admin URL), BENCH_SECONDS (20), BENCH_CLIENTS (32), BENCH_STORM (10000),
//! BENCH_WRITERS (the server's default), BENCH_ONRAMP (target/release/onramp), BENCH_SETUP_SQL (run after the migrations),
//! BENCH_LOG (the server's log filter, `warn`; e.g. `warn,onramp::intake=debug` logs each write's size and time).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onramp::intake::SigningSecret;
use serde_json::{Value, json};
use sqlx::{Connection, PgConnection, PgPool};

#[path = "intake/wire.rs"]
mod wire;

const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const GROUP: &str = "tenant-foo-users";
const GROUP_TENANT: &str = "foo";

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Refuses to print a figure whose results do not check out.
fn refuse(what: &str) -> ! {
    eprintln!("intake bench: {what}: no figure printed");
    std::process::exit(1)
}

/// A field of /proc/<pid>/status in kB.
fn status_kb(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| l.strip_prefix(field)?.trim().strip_suffix("kB")?.trim().parse().ok())
}

struct Sent {
    accepted: usize,
    latencies_us: Vec<u64>,
}

/// The i-th delivery as an HTTP request to `host`, signed.
fn signed(key: &SigningSecret, host: &str, i: usize, body: fn(usize) -> Value) -> Vec<u8> {
    let raw = serde_json::to_vec(&body(i)).unwrap();
    let id = format!("msg_{i}");
    let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let signature = key.sign(&id, ts, &raw);
    let headers =
        [("webhook-id", id.as_str()), ("webhook-timestamp", &ts.to_string()), ("webhook-signature", &signature)];
    wire::post(host, "/webhooks/authentik", &headers, &raw)
}

/// Posts deliveries from `clients` tasks until `stop` says so; `body(i)` is the i-th delivery.
/// The first `prepare` are serialized and signed before the clock starts (Authentik signs on its
/// own machine, not on this one's two cores); any past those are signed as they are sent.
async fn send(
    host: &str,
    clients: usize,
    prepare: usize,
    stop: impl Fn(usize, Instant) -> bool + Send + Sync + 'static,
    body: fn(usize) -> Value,
) -> Sent {
    let next = Arc::new(AtomicUsize::new(0));
    let key: Arc<SigningSecret> = Arc::new(WHSEC.parse().unwrap());
    let ready: Arc<Vec<Vec<u8>>> = Arc::new((0..prepare).map(|i| signed(&key, host, i, body)).collect());
    let stop = Arc::new(stop);
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (next, key, stop, ready, host) = (next.clone(), key.clone(), stop.clone(), ready.clone(), host.to_string());
        tasks.spawn(async move {
            let (mut accepted, mut lat) = (0usize, Vec::new());
            let mut conn = wire::Conn::new(&host);
            loop {
                let i = next.fetch_add(1, Relaxed);
                if stop(i, t0) {
                    return (accepted, lat);
                }
                let late;
                let request = match ready.get(i) {
                    Some(r) => r,
                    None => {
                        late = signed(&key, &host, i, body);
                        &late
                    }
                };
                let sent = Instant::now();
                let (status, answer) = match conn.send(request).await {
                    Ok((status, body)) => (status, serde_json::from_slice(body).unwrap_or(Value::Null)),
                    Err(e) => refuse(&format!("delivery {i}: {e}")),
                };
                lat.push(sent.elapsed().as_micros() as u64);
                if status != 202 || answer["duplicate"] != false || answer["delivery"].as_str().is_none() {
                    refuse(&format!("delivery {i} answered {status} {answer}"));
                }
                accepted += 1;
            }
        });
    }
    let mut out = Sent { accepted: 0, latencies_us: vec![] };
    while let Some(r) = tasks.join_next().await {
        let (n, lat) = r.unwrap();
        out.accepted += n;
        out.latencies_us.extend(lat);
    }
    out.latencies_us.sort_unstable();
    out
}

fn percentile_ms(sorted_us: &[u64], p: f64) -> f64 {
    if sorted_us.is_empty() {
        return f64::NAN;
    }
    let at = ((sorted_us.len() as f64 * p).ceil() as usize).clamp(1, sorted_us.len()) - 1;
    sorted_us[at] as f64 / 1000.0
}

/// Waits until the pump has processed every stored delivery (at most `deadline`).
async fn pumped(pool: &PgPool, deadline: Duration) -> f64 {
    let t0 = Instant::now();
    loop {
        let pending: i64 = sqlx::query_scalar("select count(*) from webhook_deliveries where processed_at is null")
            .fetch_one(pool)
            .await
            .unwrap();
        if pending == 0 {
            return t0.elapsed().as_secs_f64();
        }
        if t0.elapsed() > deadline {
            refuse(&format!("{pending} deliveries still unprocessed after {deadline:?}"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn user_event(i: usize) -> Value {
    json!({
        "event_uuid": format!("{:032x}", i), "action": "model_updated", "app": "authentik.events.models",
        "model": {"app": "authentik_core", "model_name": "user", "pk": 1000 + i, "name": "Some Body"},
        "context": {"model": {"app": "authentik_core", "model_name": "user", "pk": 1000 + i, "name": "Some Body"}},
        "actor": {"pk": 1, "username": "akadmin"}, "created": "2026-11-30T00:00:00+00:00"
    })
}

fn group_event(i: usize) -> Value {
    let model = json!({"app": "authentik_core", "model_name": "group", "pk": "9a4f0c2e1b7d4e3f8a6b5c4d3e2f1a0b", "name": GROUP});
    json!({
        "event_uuid": format!("{:032x}", 0x5700_0000_0000usize + i), "action": "model_updated",
        "app": "authentik.events.models", "model": model, "context": {"model": model},
        "actor": {"pk": 1, "username": "akadmin"}, "created": "2026-11-30T00:00:00+00:00"
    })
}

#[tokio::main]
async fn main() {
    let smoke = std::env::var("ONRAMP_BENCH_SMOKE").is_ok_and(|v| !v.is_empty() && v != "0");
    let admin = std::env::var("BENCH_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let seconds: f64 = env("BENCH_SECONDS", if smoke { 2.0 } else { 20.0 });
    let clients: usize = env("BENCH_CLIENTS", 32);
    let storm: usize = env("BENCH_STORM", if smoke { 500 } else { 10_000 });
    let name = "onramp_bench_intake";
    let mut c = PgConnection::connect(&admin).await.expect("BENCH_PG reachable");
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await.unwrap();
    sqlx::query(&format!("create database {name}")).execute(&mut c).await.unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let exe = std::env::var("BENCH_ONRAMP").unwrap_or_else(|_| "target/release/onramp".into());
    let tenants = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/authentik/tenants.example.yaml");
    let mut cmd = tokio::process::Command::new(&exe);
    // the server's own default unless BENCH_WRITERS says otherwise
    match std::env::var("BENCH_WRITERS") {
        Ok(w) => cmd.env("ONRAMP_WEBHOOK_WRITERS", w),
        Err(_) => cmd.env_remove("ONRAMP_WEBHOOK_WRITERS"),
    };
    let mut server = cmd
        .args(["serve", "--role", "api", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", &url)
        .env("ONRAMP_LOG", std::env::var("BENCH_LOG").unwrap_or_else(|_| "warn".into()))
        .env("ONRAMP_TENANTS", tenants)
        .env("ONRAMP_AUTHENTIK_URL", "http://127.0.0.1:9") // not called by the api role's intake
        .env("ONRAMP_AUTHENTIK_TOKEN", "unused")
        .env("ONRAMP_WEBHOOK_SECRETS", WHSEC)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{exe}: {e} (build it: cargo build --release)"));
    let pid = server.id().expect("the server runs");
    let host = format!("127.0.0.1:{port}");
    let base = format!("http://{host}");
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "onramp did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // idle: ready, one second without load
    tokio::time::sleep(Duration::from_secs(1)).await;
    let idle_kb = status_kb(pid, "VmRSS:").unwrap_or_else(|| refuse("no VmRSS for the server"));
    let peak = Arc::new(AtomicU64::new(idle_kb));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(Relaxed) {
                if let Some(kb) = status_kb(pid, "VmRSS:") {
                    peak.fetch_max(kb, Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let pool = PgPool::connect(&url).await.unwrap();
    // BENCH_SETUP_SQL: statements run once the server has migrated, for A/B experiments on the
    // schema (bench/wal-profile.sh intake) without a rebuild
    if let Ok(sql) = std::env::var("BENCH_SETUP_SQL") {
        sqlx::raw_sql(&sql).execute(&pool).await.expect("BENCH_SETUP_SQL runs");
    }

    // 1. intake for `seconds`
    let window = Duration::from_secs_f64(seconds);
    // the WAL range from the first request until the pump has caught up (bench/wal-profile.sh
    // breaks it down by record type): all a delivery costs the database
    let lsn = || sqlx::query_scalar::<_, String>("select pg_current_wal_lsn()::text").fetch_one(&pool);
    let wal_from = lsn().await.unwrap();
    let t0 = Instant::now();
    // as many as 15,000 a second could send (more are signed as they go)
    let prepare = (15_000.0 * seconds) as usize;
    let sent = send(&host, clients, prepare, move |_, t0| t0.elapsed() >= window, user_event).await;
    let secs = t0.elapsed().as_secs_f64();
    let catch_up = pumped(&pool, Duration::from_secs(120)).await;
    let wal_to = lsn().await.unwrap();
    sampling.store(false, Relaxed);
    sampler.await.unwrap();
    let hwm_kb = status_kb(pid, "VmHWM:").unwrap_or(0);
    let (stored, processed, linked): (i64, i64, i64) = sqlx::query_as(
        "select count(*), count(processed_at), count(*) filter (where cardinality(job_ids) = 1) from webhook_deliveries",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let jobs: i64 = sqlx::query_scalar("select count(distinct subject) from jobs where kind = 'reconcile.user'")
        .fetch_one(&pool)
        .await
        .unwrap();
    let n = sent.accepted as i64;
    if (stored, processed, linked, jobs) != (n, n, n, n) {
        refuse(&format!(
            "{n} acknowledged, yet {stored} stored, {processed} processed, {linked} with their job, {jobs} user jobs"
        ));
    }
    println!(
        "{}",
        json!({"system": "onramp", "measure": "webhook_intake", "clients": clients, "deliveries": sent.accepted,
               "stored": stored, "processed": processed, "jobs": jobs, "seconds": secs,
               "deliveries_per_s": sent.accepted as f64 / secs,
               "p50_ms": percentile_ms(&sent.latencies_us, 0.50), "p99_ms": percentile_ms(&sent.latencies_us, 0.99),
               "pump_catch_up_s": catch_up, "wal_from": wal_from, "wal_to": wal_to, "smoke": smoke})
    );
    println!(
        "{}",
        json!({"system": "onramp", "measure": "serve_rss", "idle_mb": idle_kb as f64 / 1024.0,
               "peak_mb": peak.load(Relaxed) as f64 / 1024.0, "hwm_mb": hwm_kb as f64 / 1024.0,
               "during": "webhook_intake", "smoke": smoke})
    );

    // 2. the event storm about one group
    let t0 = Instant::now();
    let sent = send(&host, clients, storm, move |i, _| i >= storm, group_event).await;
    let secs = t0.elapsed().as_secs_f64();
    pumped(&pool, Duration::from_secs(120)).await;
    let (stored, linked): (i64, i64) = sqlx::query_as(
        "select count(*), count(*) filter (where cardinality(job_ids) >= 1)
         from webhook_deliveries where model = 'authentik_core.group'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let group_jobs: i64 =
        sqlx::query_scalar("select count(*) from jobs where kind = 'reconcile.tenant' and subject = $1")
            .bind(format!("reconcile/tenant/{GROUP_TENANT}"))
            .fetch_one(&pool)
            .await
            .unwrap();
    if sent.accepted != storm || (stored, linked) != (storm as i64, storm as i64) || group_jobs < 1 {
        refuse(&format!(
            "storm: {} of {storm} acknowledged, {stored} stored, {linked} processed into a job, {group_jobs} group jobs",
            sent.accepted
        ));
    }
    println!(
        "{}",
        json!({"system": "onramp", "measure": "event_storm", "deliveries": storm, "acknowledged": sent.accepted,
               "seconds": secs, "within_10s": secs <= 10.0, "reconcile_jobs": group_jobs,
               "p99_ms": percentile_ms(&sent.latencies_us, 0.99), "smoke": smoke})
    );

    pool.close().await;
    server.kill().await.ok();
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await.unwrap();
}

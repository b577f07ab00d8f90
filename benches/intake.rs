//! Webhook intake speed: `onramp serve --role api` (release build) with the Authentik intake on,
//! 32 concurrent clients posting signed Standard Webhooks deliveries (each a distinct Authentik
//! event about a user). Every delivery is stored and its reconcile job enqueued before the 202.
//! Compare with bench/reference (pgbench single-row INSERT at 32 clients on the same PostgreSQL).
//!
//!   cargo build --release && cargo bench --bench intake
//!
//! Settings: BENCH_PG (admin URL), BENCH_DELIVERIES (20000), BENCH_CLIENTS (32), BENCH_ONRAMP.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use onramp::intake::SigningSecret;
use serde_json::json;
use sqlx::{Connection, PgConnection};

const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[tokio::main]
async fn main() {
    let admin = std::env::var("BENCH_PG").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let total: usize = env("BENCH_DELIVERIES", 20_000);
    let clients: usize = env("BENCH_CLIENTS", 32);
    let name = "onramp_bench_intake";
    let mut c = PgConnection::connect(&admin).await.expect("BENCH_PG reachable");
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await.unwrap();
    sqlx::query(&format!("create database {name}")).execute(&mut c).await.unwrap();
    let url = format!("{}/{name}", admin.rsplit_once('/').unwrap().0);

    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let exe = std::env::var("BENCH_ONRAMP").unwrap_or_else(|_| "target/release/onramp".into());
    let tenants = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/authentik/tenants.example.yaml");
    let mut server = tokio::process::Command::new(&exe)
        .args(["serve", "--role", "api", "--listen", &format!("127.0.0.1:{port}")])
        .env("DATABASE_URL", &url)
        .env("ONRAMP_LOG", "warn")
        .env("ONRAMP_TENANTS", tenants)
        .env("ONRAMP_AUTHENTIK_URL", "http://127.0.0.1:9") // not called by the api role's intake
        .env("ONRAMP_AUTHENTIK_TOKEN", "unused")
        .env("ONRAMP_WEBHOOK_SECRETS", WHSEC)
        .env("ONRAMP_WEBHOOK_WRITERS", std::env::var("BENCH_WRITERS").unwrap_or_else(|_| "2".into()))
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("{exe}: {e} (build it: cargo build --release)"));
    let base = format!("http://127.0.0.1:{port}");
    let http = reqwest::Client::builder().pool_max_idle_per_host(clients).build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http.get(format!("{base}/readyz")).send().await.is_ok_and(|r| r.status().is_success()) {
        assert!(Instant::now() < deadline, "onramp did not become ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let next = Arc::new(AtomicUsize::new(0));
    let key: Arc<SigningSecret> = Arc::new(WHSEC.parse().unwrap());
    let t0 = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let (http, next, key, url) = (http.clone(), next.clone(), key.clone(), format!("{base}/webhooks/authentik"));
        tasks.spawn(async move {
            let mut accepted = 0usize;
            loop {
                let i = next.fetch_add(1, Relaxed);
                if i >= total {
                    return accepted;
                }
                let body = json!({
                    "event_uuid": format!("{:032x}", i), "action": "model_updated", "app": "authentik.events.models",
                    "model": {"app": "authentik_core", "model_name": "user", "pk": 1000 + i, "name": "Some Body"},
                    "context": {"model": {"app": "authentik_core", "model_name": "user", "pk": 1000 + i, "name": "Some Body"}},
                    "actor": {"pk": 1, "username": "akadmin"}, "created": "2026-11-30T00:00:00+00:00"
                });
                let raw = serde_json::to_vec(&body).unwrap();
                let id = format!("msg_{i}");
                let ts = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
                let r = http
                    .post(&url)
                    .header("content-type", "application/json")
                    .header("webhook-id", &id)
                    .header("webhook-timestamp", ts.to_string())
                    .header("webhook-signature", key.sign(&id, ts, &raw))
                    .body(raw)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 202, "{}", r.text().await.unwrap_or_default());
                accepted += 1;
            }
        });
    }
    let mut accepted = 0;
    while let Some(n) = tasks.join_next().await {
        accepted += n.unwrap();
    }
    let secs = t0.elapsed().as_secs_f64();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let stored: i64 =
        sqlx::query_scalar("select count(*) from webhook_deliveries").fetch_one(&pool).await.unwrap_or(-1);
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&pool).await.unwrap();
    println!(
        "{}",
        json!({"system": "onramp", "measure": "webhook_intake", "clients": clients, "deliveries": accepted,
               "stored": stored, "jobs": jobs, "seconds": secs, "deliveries_per_s": accepted as f64 / secs})
    );
    pool.close().await;
    server.kill().await.ok();
    sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await.unwrap();
}

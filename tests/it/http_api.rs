//! The HTTP surface as a client sees it: health, metrics, the token-guarded /v1 job routes.

use std::time::Duration;

use onramp::engine::{Actor, NewJob};
use onramp::http::access::Role;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;

struct App {
    base: String,
    stop: CancellationToken,
    engine: onramp::engine::Engine,
    http: reqwest::Client,
    _db: TestDb,
}

/// A token of `role` (optionally scoped to `tenant`) in the app's database.
pub async fn token(engine: &onramp::engine::Engine, name: &str, role: Role, tenant: Option<&str>) -> String {
    let tenant = tenant.map(|t| onramp::domain::names::TenantName::parse(t).unwrap());
    onramp::http::access::create(engine.pool(), name, role, tenant.as_ref(), None, &Actor::cli("test"))
        .await
        .unwrap()
        .expose()
        .to_string()
}

async fn app(with_worker: bool) -> App {
    let db = TestDb::new().await;
    let engine = engine(&db, onramp::flows::registry());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let worker = with_worker.then(|| worker_config("api-test", Duration::from_secs(10)));
    let (e, s) = (engine.clone(), stop.clone());
    tokio::spawn(async move { onramp::app::world::World::bare(e).run(Some(listener), worker, s).await.unwrap() });
    App { base, stop, engine, http: reqwest::Client::new(), _db: db }
}

impl App {
    async fn get(&self, path: &str, token: &str) -> (StatusCode, String, Value) {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        let status = r.status();
        let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        (status, ct, r.json().await.unwrap_or(Value::Null))
    }
    async fn post(&self, path: &str, token: &str) -> (StatusCode, Value) {
        let r = self.http.post(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_wants_a_token_and_says_so_in_problem_json() {
    let a = app(false).await;
    let t = token(&a.engine, "ops", Role::Viewer, None).await;
    let (status, ct, body) = a.get("/v1/jobs", "onr_wrong").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert_eq!(ct, "application/problem+json");
    assert_eq!(body["type"], "urn:onramp:problem:unauthorized");
    let (status, _, body) = a.get("/v1/jobs", &t).await;
    assert_eq!((status, body["jobs"].as_array().unwrap().len()), (StatusCode::OK, 0));
    let (status, _, body) = a.get("/v1/jobs/99", &t).await;
    assert_eq!((status, body["type"].as_str()), (StatusCode::NOT_FOUND, Some("urn:onramp:problem:not-found")));
    let (status, _, body) = a.get("/v1/jobs?state=sideways", &t).await;
    assert_eq!((status, body["type"].as_str()), (StatusCode::BAD_REQUEST, Some("urn:onramp:problem:bad-request")));
    // revocation takes effect at once
    onramp::http::access::revoke(a.engine.pool(), "ops").await.unwrap();
    assert_eq!(a.get("/v1/jobs", &t).await.0, StatusCode::UNAUTHORIZED);
    a.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_authentication_is_rate_limited_per_source() {
    let a = app(false).await;
    let t = token(&a.engine, "ops", Role::Viewer, None).await;
    for _ in 0..20 {
        assert_eq!(a.get("/v1/jobs", "onr_guess").await.0, StatusCode::UNAUTHORIZED);
    }
    let r = a.http.get(format!("{}/v1/jobs", a.base)).bearer_auth("onr_guess").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS, "a blocked source's guesses wait");
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(a.get("/v1/jobs", &t).await.0, StatusCode::OK, "a valid token is never refused");
    a.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_readiness_and_metrics_answer() {
    let a = app(true).await;
    for path in ["/healthz", "/readyz"] {
        let r = a.http.get(format!("{}{path}", a.base)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{path}");
    }
    let job = NewJob::new("selftest", "tenant-a/alice", json!({"fail_attempts": 5}), Actor::cli("test"));
    let id = a.engine.enqueue(&[job]).await.unwrap()[0].id;
    wait_state(&a.engine, id, "failed", Duration::from_secs(20)).await;
    let text = a.http.get(format!("{}/metrics", a.base)).send().await.unwrap().text().await.unwrap();
    assert!(text.contains("onramp_steps_retried_total 4"), "{text}");
    assert!(text.contains("onramp_jobs_open{state=\"failed\"} 1"), "{text}");
    a.stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_are_listed_shown_approved_retried_and_cancelled_over_http() {
    let a = app(true).await;
    let t = token(&a.engine, "ops", Role::Operator, None).await;
    let t = t.as_str();
    let mk = |subject: &str, input: Value| NewJob::new("selftest", subject, input, Actor::cli("test"));
    let ids: Vec<i64> = a
        .engine
        .enqueue(&[
            mk("tenant-a/alice", json!({"approval": true})),
            mk("tenant-a/bob", json!({"fail_attempts": 5})),
            mk("tenant-b/carol", json!({"wait_ms": 60000})),
        ])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    wait_state(&a.engine, ids[0], "needs_approval", Duration::from_secs(20)).await;
    wait_state(&a.engine, ids[1], "failed", Duration::from_secs(20)).await;
    wait_state(&a.engine, ids[2], "waiting", Duration::from_secs(20)).await;

    let (_, _, page) = a.get("/v1/jobs?limit=2", t).await;
    assert_eq!(page["jobs"].as_array().unwrap().len(), 2);
    let next = page["next"].as_i64().unwrap();
    let (_, _, rest) = a.get(&format!("/v1/jobs?limit=2&before={next}"), t).await;
    assert_eq!(rest["jobs"][0]["id"].as_i64(), Some(ids[0]));
    let (_, _, tenant_a) = a.get("/v1/jobs?subject=tenant-a/", t).await;
    assert_eq!(tenant_a["jobs"].as_array().unwrap().len(), 2);

    let (status, job) = a.post(&format!("/v1/jobs/{}/approve", ids[0]), t).await;
    assert_eq!((status, job["state"].as_str()), (StatusCode::OK, Some("pending")));
    wait_state(&a.engine, ids[0], "succeeded", Duration::from_secs(20)).await;
    let (_, _, detail) = a.get(&format!("/v1/jobs/{}", ids[0]), t).await;
    assert_eq!(detail["job"]["outputs"]["finish"]["approved_by"], "api:ops");
    assert!(detail["events"].as_array().unwrap().iter().any(|e| e["actor"] == "api:ops"));
    assert_eq!(detail["steps"].as_array().unwrap().len(), 4);

    let (status, _) = a.post(&format!("/v1/jobs/{}/retry", ids[1]), t).await;
    assert_eq!(status, StatusCode::OK);
    let (status, conflict) = a.post(&format!("/v1/jobs/{}/retry", ids[0]), t).await;
    assert_eq!((status, conflict["type"].as_str()), (StatusCode::CONFLICT, Some("urn:onramp:problem:invalid-state")));
    let (status, job) = a.post(&format!("/v1/jobs/{}/cancel", ids[2]), t).await;
    assert_eq!((status, job["state"].as_str()), (StatusCode::OK, Some("cancelled")));
    a.stop.cancel();
}

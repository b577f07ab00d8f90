//! Slow and hostile clients (issue #13): NUL in queries, paths and bodies is refused (never a
//! 500); partial heads, stalled and chunked bodies and idle connections are dropped within their
//! timeouts; connections and live streams are limited; the login limiter never refuses a valid
//! token and believes X-Forwarded-For only from trusted proxies; readiness answers within a
//! second whatever the database does, and at once when it refuses connections.

use std::time::{Duration, Instant};

use onramp::engine::{Actor, Engine, NewJob};
use onramp::http::access::Role;
use onramp::http::{HttpSettings, IpNet};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::postgres::PgPoolOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::http_api::token;

struct App {
    base: String,
    addr: String,
    engine: Engine,
    http: reqwest::Client,
    stop: CancellationToken,
    server: JoinHandle<()>,
    _db: Option<TestDb>,
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn serve(engine: Engine, settings: HttpSettings, db: Option<TestDb>) -> App {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let stop = CancellationToken::new();
    let world = onramp::app::world::World::bare(engine.clone()).with_http(settings);
    let s = stop.clone();
    let server = tokio::spawn(async move { world.run(Some(listener), None, s).await.unwrap() });
    App { base: format!("http://{addr}"), addr, engine, http: reqwest::Client::new(), stop, server, _db: db }
}

async fn app(settings: HttpSettings) -> App {
    let db = TestDb::new().await;
    let engine = engine(&db, onramp::flows::registry());
    serve(engine, settings, Some(db)).await
}

/// Timeouts short enough for a test.
fn short() -> HttpSettings {
    HttpSettings {
        header_timeout: Duration::from_millis(400),
        body_timeout: Duration::from_millis(400),
        idle_timeout: Duration::from_millis(600),
        ..HttpSettings::default()
    }
}

/// Reads until the server closes the connection and returns what it sent; panics when the
/// connection is still open after `deadline`.
async fn until_closed(conn: &mut TcpStream, deadline: Duration, what: &str) -> String {
    let read = async {
        let (mut got, mut buf) = (Vec::new(), [0u8; 4096]);
        loop {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return got,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    };
    let got =
        tokio::time::timeout(deadline, read).await.unwrap_or_else(|_| panic!("{what}: still open after {deadline:?}"));
    String::from_utf8_lossy(&got).into_owned()
}

async fn connect(a: &App, sent: &str) -> TcpStream {
    let mut conn = TcpStream::connect(&a.addr).await.unwrap();
    conn.write_all(sent.as_bytes()).await.unwrap();
    conn
}

impl App {
    async fn get(&self, path: &str, token: &str) -> (StatusCode, Value) {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        problem_or_json(r).await
    }

    async fn post(&self, path: &str, token: &str, body: &str) -> (StatusCode, Value) {
        let r = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        problem_or_json(r).await
    }
}

async fn problem_or_json(r: reqwest::Response) -> (StatusCode, Value) {
    let status = r.status();
    let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let body = r.json().await.unwrap_or(Value::Null);
    if status.is_client_error() || status.is_server_error() {
        assert_eq!(ct, "application/problem+json", "{status} {body}");
    }
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nul_in_queries_paths_and_bodies_is_refused_never_a_500() {
    let a = app(HttpSettings::default()).await;
    let admin = token(&a.engine, "root-admin", Role::Admin, None).await;
    let job = NewJob::new("selftest", "tenant-a/alice", json!({"fail_attempts": 0}), Actor::cli("test"));
    let id = a.engine.enqueue(&[job]).await.unwrap()[0].id;
    for path in [
        "/v1/jobs?tenant=%00",
        "/v1/jobs?tenant=a%00b",
        "/v1/jobs?subject=tenant-a%2Falice%00",
        "/v1/jobs?kind=selftest%00",
        "/v1/jobs?tenant=tenant-a&user=al%00ice",
        "/v1/jobs?state=failed%00",
        "/v1/jobs?before=1%00",
        "/v1/jobs?tenant=%01",
        "/v1/tenants/ten%00ant",
        "/v1/plans/user.onboard?tenant=a%00&user=b",
    ] {
        let (status, body) = a.get(path, &admin).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert!(body["detail"].as_str().unwrap().contains("control character"), "{path}: {body}");
    }
    let (status, body) = a.post("/v1/tokens/ops%00/revoke", &admin, "").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // a NUL in a JSON string: refused, naming the field, before anything reaches PostgreSQL
    for (path, sent, field) in [
        ("/v1/tokens", r#"{"name": "ops\u0000x", "role": "viewer"}"#, "/name"),
        ("/v1/jobs", r#"{"kind": "user.onboard", "tenant": "t\u0000", "username": "alice"}"#, "/tenant"),
        (&format!("/v1/jobs/{id}/cancel") as &str, r#"{"reason": "because\u0000"}"#, "/reason"),
    ] {
        let (status, body) = a.post(path, &admin, sent).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {body}");
        assert!(body["detail"].as_str().unwrap().contains(&format!("field {field} contains a NUL")), "{body}");
    }
    // an escaped backslash before "u0000" is text, not NUL
    let (status, body) = a.post(&format!("/v1/jobs/{id}/cancel"), &admin, r#"{"reason": "a \\u0000 b"}"#).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(a.get("/v1/jobs?tenant=tenant-a", &admin).await.0, StatusCode::OK);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partial_heads_silent_and_idle_connections_are_closed() {
    let a = app(short()).await;
    let deadline = Duration::from_secs(3);
    let mut partial = connect(&a, "GET /healthz HTTP/1.1\r\nhost: onramp\r\nx-slow: ").await;
    until_closed(&mut partial, deadline, "a partial request head").await;
    let mut silent = connect(&a, "").await;
    until_closed(&mut silent, deadline, "a connection that sends nothing").await;
    // a kept-alive connection is answered, then closed once idle
    let mut idle = connect(&a, "GET /healthz HTTP/1.1\r\nhost: onramp\r\n\r\n").await;
    let answer = until_closed(&mut idle, deadline, "an idle kept-alive connection").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_and_chunked_bodies_are_answered_408_and_closed() {
    let a = app(short()).await;
    let t = token(&a.engine, "ops", Role::Operator, None).await;
    let deadline = Duration::from_secs(3);
    let head = |path: &str, framing: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nhost: onramp\r\nauthorization: Bearer {t}\r\ncontent-type: application/json\r\n{framing}\r\n"
        )
    };
    for path in ["/v1/jobs", "/v1/tokens", "/v1/jobs/1/cancel"] {
        let started = Instant::now();
        let mut stalled = connect(&a, &(head(path, "content-length: 100\r\n") + "{\"")).await;
        let answer = until_closed(&mut stalled, deadline, "a body announced as 100 bytes, 2 sent").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
        assert!(answer.contains("urn:onramp:problem:body-timeout"), "{answer}");
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        let mut chunked = connect(&a, &(head(path, "transfer-encoding: chunked\r\n") + "2\r\n{\"\r\n")).await;
        let answer = until_closed(&mut chunked, deadline, "a chunked body that stalls").await;
        assert!(answer.starts_with("HTTP/1.1 408"), "{path}: {answer}");
    }
    // routes that never read the body (the webhook here has no intake, an unknown route) close too
    for path in ["/webhooks/authentik", "/no/such/route"] {
        let mut stalled = connect(&a, &(head(path, "content-length: 100\r\n") + "{\"")).await;
        until_closed(&mut stalled, deadline, path).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_limit_are_closed_and_a_freed_slot_is_used() {
    let a =
        app(HttpSettings { max_connections: 3, header_timeout: Duration::from_secs(30), ..HttpSettings::default() })
            .await;
    // three kept-alive connections, each answered once (so each surely holds its slot)
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = connect(&a, "GET /healthz HTTP/1.1\r\nhost: onramp\r\n\r\n").await;
        let (mut got, mut buf) = (Vec::new(), [0u8; 1024]);
        while !got.ends_with(b"\r\n\r\nok\n") {
            let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0, "answered");
            got.extend_from_slice(&buf[..n]);
        }
        held.push(c);
    }
    let mut over = connect(&a, "GET /healthz HTTP/1.1\r\nhost: onramp\r\nconnection: close\r\n\r\n").await;
    let answer = until_closed(&mut over, Duration::from_secs(4), "a connection over the limit").await;
    assert_eq!(answer, "", "not served");
    held.pop();
    eventually(Duration::from_secs(5), "a freed slot to serve a new connection", || async {
        let mut c = connect(&a, "GET /healthz HTTP/1.1\r\nhost: onramp\r\nconnection: close\r\n\r\n").await;
        let answer = until_closed(&mut c, Duration::from_secs(4), "a connection in a freed slot").await;
        answer.starts_with("HTTP/1.1 200").then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_logins_never_lock_out_a_valid_token() {
    let a = app(HttpSettings::default()).await;
    let t = token(&a.engine, "ops", Role::Viewer, None).await;
    let mut statuses = Vec::new();
    for _ in 0..25 {
        statuses.push(a.get("/v1/jobs", "onr_guess").await.0);
    }
    assert!(statuses[..20].iter().all(|s| *s == StatusCode::UNAUTHORIZED), "{statuses:?}");
    assert!(statuses[20..].iter().all(|s| *s == StatusCode::TOO_MANY_REQUESTS), "{statuses:?}");
    let r = a.http.get(format!("{}/v1/jobs", a.base)).bearer_auth("onr_guess").send().await.unwrap();
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(a.get("/v1/jobs", &t).await.0, StatusCode::OK, "a valid token from a blocked source");
}

async fn guesses(a: &App, forwarded_for: &str, n: usize) -> Vec<StatusCode> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = a
            .http
            .get(format!("{}/v1/jobs", a.base))
            .bearer_auth("onr_guess")
            .header("x-forwarded-for", forwarded_for)
            .send()
            .await
            .unwrap();
        out.push(r.status());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_for_counts_only_from_trusted_proxies() {
    // the test's peer (127.0.0.1) is not trusted: every claimed source is the one peer
    let a = app(HttpSettings::default()).await;
    for i in 0..20 {
        assert_eq!(guesses(&a, &format!("203.0.113.{i}"), 1).await, [StatusCode::UNAUTHORIZED]);
    }
    assert_eq!(guesses(&a, "203.0.113.99", 1).await, [StatusCode::TOO_MANY_REQUESTS], "XFF ignored");
    drop(a);
    // behind a trusted proxy: the right-most untrusted address is the source
    let trusted = vec![IpNet::parse("127.0.0.0/8").unwrap()];
    let a = app(HttpSettings { trusted_proxies: trusted, ..HttpSettings::default() }).await;
    let blocked = guesses(&a, "198.51.100.1, 203.0.113.7", 21).await;
    assert_eq!(blocked[19..], [StatusCode::UNAUTHORIZED, StatusCode::TOO_MANY_REQUESTS], "{blocked:?}");
    assert_eq!(guesses(&a, "203.0.113.8", 1).await, [StatusCode::UNAUTHORIZED], "another client behind the proxy");
    assert_eq!(guesses(&a, "203.0.113.7, 127.0.0.5", 1).await, [StatusCode::TOO_MANY_REQUESTS], "trusted hops skipped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_answers_within_a_second_during_an_outage_and_200_after() {
    // a "database" that accepts connections and never answers
    let silent = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("postgres://postgres@{}/onramp", silent.local_addr().unwrap());
    let hold = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = silent.accept().await {
            held.push(c);
        }
    });
    let pool = PgPoolOptions::new().acquire_timeout(Duration::from_secs(10)).connect_lazy(&url).unwrap();
    let a = serve(Engine::new(pool, onramp::flows::registry()), HttpSettings::default(), None).await;
    for _ in 0..2 {
        let started = Instant::now();
        let r = a.http.get(format!("{}/readyz", a.base)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
        let (_, body) = problem_or_json(r).await;
        assert_eq!(body["type"], "urn:onramp:problem:not-ready");
    }
    hold.abort();
    let ok = app(HttpSettings::default()).await;
    let started = Instant::now();
    assert_eq!(ok.http.get(format!("{}/readyz", ok.base)).send().await.unwrap().status(), StatusCode::OK);
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_answers_503_at_once_when_the_database_refuses_connections() {
    // a stopped server: nothing listens on its port. The pool would retry a refused connection
    // until its acquire timeout, so readiness answered only at its own one-second timeout.
    let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/onramp");
    let pool = PgPoolOptions::new().acquire_timeout(Duration::from_secs(10)).connect_lazy(&url).unwrap();
    let a = serve(Engine::new(pool, onramp::flows::registry()), HttpSettings::default(), None).await;
    for _ in 0..3 {
        let started = Instant::now();
        let r = a.http.get(format!("{}/readyz", a.base)).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(started.elapsed() < Duration::from_millis(300), "{:?}", started.elapsed());
    }
}

async fn open_stream(a: &App, t: &str) -> reqwest::Response {
    a.http.get(format!("{}/v1/stream", a.base)).bearer_auth(t).send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_streams_are_limited_per_token_and_end_after_their_lifetime() {
    let a = app(HttpSettings { streams_per_token: 2, ..HttpSettings::default() }).await;
    let (t, other) =
        (token(&a.engine, "ops", Role::Viewer, None).await, token(&a.engine, "dash", Role::Viewer, None).await);
    let mut open = vec![open_stream(&a, &t).await, open_stream(&a, &t).await];
    assert!(open.iter().all(|r| r.status() == StatusCode::OK));
    let over = open_stream(&a, &t).await;
    assert_eq!(over.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(over.headers().get("retry-after").is_some());
    let (_, body) = problem_or_json(over).await;
    assert_eq!(body["type"], "urn:onramp:problem:too-many-streams");
    assert_eq!(open_stream(&a, &other).await.status(), StatusCode::OK, "another token has its own streams");
    open.pop();
    eventually(Duration::from_secs(5), "a closed stream's slot to be free", || async {
        let r = open_stream(&a, &t).await;
        (r.status() == StatusCode::OK).then_some(())
    })
    .await;
    drop(open);
    drop(a);

    let a = app(HttpSettings { stream_lifetime: Duration::from_millis(500), ..HttpSettings::default() }).await;
    let t = token(&a.engine, "ops", Role::Viewer, None).await;
    let mut s = open_stream(&a, &t).await;
    let ended = async { while s.chunk().await.unwrap().is_some() {} };
    tokio::time::timeout(Duration::from_secs(5), ended).await.expect("the stream ends after its lifetime");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_shutdown_streams_end_and_the_server_stops() {
    let mut a = app(HttpSettings::default()).await;
    let t = token(&a.engine, "ops", Role::Viewer, None).await;
    let mut s = open_stream(&a, &t).await;
    assert_eq!(s.status(), StatusCode::OK);
    a.stop.cancel();
    let ended = async { while let Ok(Some(_)) = s.chunk().await {} };
    tokio::time::timeout(Duration::from_secs(5), ended).await.expect("the stream ends at shutdown");
    tokio::time::timeout(Duration::from_secs(5), &mut a.server).await.expect("the server stops").unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_webhook_body_is_answered_408_within_the_body_timeout() {
    // the intake's own app, with the default settings (ONRAMP_HTTP_BODY_TIMEOUT 10s)
    let db = TestDb::new().await;
    let app = crate::intake_support::app(&db, crate::intake_support::AppOptions::default()).await;
    let addr = app.base.trim_start_matches("http://").to_string();
    let mut conn = TcpStream::connect(&addr).await.unwrap();
    let head = "POST /webhooks/authentik HTTP/1.1\r\nhost: onramp\r\ncontent-type: application/json\r\n\
                content-length: 100\r\n\r\n{\"";
    conn.write_all(head.as_bytes()).await.unwrap();
    let answer = until_closed(&mut conn, Duration::from_secs(15), "a stalled webhook body").await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("urn:onramp:problem:body-timeout"), "{answer}");
}

/// The subjects of the `job` events `s` sends until it has sent one of `until`'s subject.
async fn subjects_until(s: &mut reqwest::Response, until: &str) -> Vec<String> {
    let read = async {
        let (mut text, mut subjects) = (String::new(), Vec::new());
        while !subjects.iter().any(|s| s == until) {
            text.push_str(&String::from_utf8_lossy(&s.chunk().await.unwrap().expect("the stream goes on")));
            while let Some(end) = text.find("\n\n") {
                let event: String = text.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|l| l.strip_prefix("data:")) {
                    let job: Value = serde_json::from_str(data.trim()).unwrap();
                    subjects.push(job["subject"].as_str().unwrap().to_string());
                }
            }
        }
        subjects
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.unwrap_or_else(|_| panic!("no event for {until}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_share_one_poller_and_each_sees_its_tenant_only() {
    // the intake's app: its tenant registry has foo and bar (scoped tokens see registry tenants only)
    let db = TestDb::new().await;
    let a = crate::intake_support::app(&db, crate::intake_support::AppOptions::default()).await;
    let http = reqwest::Client::new();
    let open = |t: String| {
        let (http, base) = (http.clone(), a.base.clone());
        async move { http.get(format!("{base}/v1/stream")).bearer_auth(t).send().await.unwrap() }
    };
    let all = token(&a.engine, "all", Role::Viewer, None).await;
    let only_a = token(&a.engine, "only-a", Role::Viewer, Some("foo")).await;
    let only_b = token(&a.engine, "only-b", Role::Viewer, Some("bar")).await;
    let (mut s_all, mut s_a, mut s_b) = (open(all).await, open(only_a).await, open(only_b).await);
    let mk = |subject: &str| NewJob::new("user.onboard", subject, json!({}), Actor::cli("test"));
    a.engine.enqueue(&[mk("foo/alice")]).await.unwrap();
    a.engine.enqueue(&[mk("bar/bob")]).await.unwrap();
    a.engine.enqueue(&[onramp::flows::reconcile::full_job(Actor::cli("test"), "test")]).await.unwrap();
    a.engine.enqueue(&[mk("foo/carol")]).await.unwrap();
    a.engine.enqueue(&[mk("bar/dave")]).await.unwrap();
    let seen = subjects_until(&mut s_all, "foo/carol").await;
    assert!(seen.contains(&"bar/bob".to_string()) && seen.contains(&"foo/alice".to_string()), "{seen:?}");
    assert!(seen.contains(&"reconcile/full".to_string()), "{seen:?}");
    let seen = subjects_until(&mut s_a, "foo/carol").await;
    assert!(seen.iter().all(|s| s.starts_with("foo/")), "{seen:?}");
    let seen = subjects_until(&mut s_b, "bar/dave").await;
    assert!(seen.iter().all(|s| s.starts_with("bar/")), "the reconciler's jobs are not a tenant's: {seen:?}");
}

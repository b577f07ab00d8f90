//! What wraps every route: request ids, CORS for the portal (off unless origins are configured),
//! the API's body limit (the webhook keeps its own) and the request timeout.

use std::time::Duration;

use onramp::http::{HttpSettings, parse_origin};
use reqwest::{Method, StatusCode};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;

const PORTAL: &str = "https://portal.example.org";

struct App {
    base: String,
    engine: onramp::engine::Engine,
    http: reqwest::Client,
    stop: CancellationToken,
    _db: TestDb,
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn app(settings: HttpSettings) -> App {
    let db = TestDb::new().await;
    let engine = engine(&db, onramp::flows::registry());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let world = onramp::app::world::World::bare(engine.clone()).with_http(settings);
    let s = stop.clone();
    tokio::spawn(async move { world.run(Some(listener), None, s).await.unwrap() });
    App { base, engine, http: reqwest::Client::new(), stop, _db: db }
}

impl App {
    async fn send(&self, method: Method, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut r = self.http.request(method, format!("{}{path}", self.base));
        for (k, v) in headers {
            r = r.header(*k, *v);
        }
        r.send().await.unwrap()
    }
}

fn header(r: &reqwest::Response, name: &str) -> Option<String> {
    r.headers().get(name).map(|v| v.to_str().unwrap().to_string())
}

fn preflight(origin: &str) -> [(&str, &str); 3] {
    [
        ("origin", origin),
        ("access-control-request-method", "POST"),
        ("access-control-request-headers", "authorization, content-type"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_answer_has_a_request_id_and_a_callers_own_is_kept() {
    let a = app(HttpSettings::default()).await;
    let r = a.send(Method::GET, "/healthz", &[]).await;
    let id = header(&r, "x-request-id").expect("a request id");
    assert!(uuid::Uuid::parse_str(&id).is_ok(), "{id}");
    let other = header(&a.send(Method::GET, "/no/such/route", &[]).await, "x-request-id").unwrap();
    assert_ne!(id, other);
    let r = a.send(Method::GET, "/v1/jobs", &[("x-request-id", "caller-chose-this")]).await;
    assert_eq!(
        (r.status(), header(&r, "x-request-id").as_deref()),
        (StatusCode::UNAUTHORIZED, Some("caller-chose-this"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_configured_origins_there_are_no_cors_headers() {
    let a = app(HttpSettings::default()).await;
    let r = a.send(Method::GET, "/healthz", &[("origin", PORTAL)]).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().keys().all(|k| !k.as_str().starts_with("access-control-")), "{:?}", r.headers());
    let r = a.send(Method::OPTIONS, "/v1/jobs", &preflight(PORTAL)).await;
    assert!(r.headers().keys().all(|k| !k.as_str().starts_with("access-control-")), "{:?}", r.headers());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portals_origin_is_allowed_and_others_are_not() {
    let settings = HttpSettings { cors_origins: vec![parse_origin(PORTAL).unwrap()], ..HttpSettings::default() };
    let a = app(settings).await;
    let r = a.send(Method::OPTIONS, "/v1/jobs", &preflight(PORTAL)).await;
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(header(&r, "access-control-allow-origin").as_deref(), Some(PORTAL));
    let allowed = header(&r, "access-control-allow-headers").unwrap_or_default().to_ascii_lowercase();
    assert!(allowed.contains("authorization") && allowed.contains("idempotency-key"), "{allowed}");
    assert!(header(&r, "access-control-allow-methods").unwrap_or_default().contains("POST"));
    // the answer itself: the origin echoed, the request id readable by the portal's script
    let r = a.send(Method::GET, "/v1/jobs", &[("origin", PORTAL)]).await;
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(header(&r, "access-control-allow-origin").as_deref(), Some(PORTAL));
    assert!(header(&r, "access-control-expose-headers").unwrap_or_default().contains("x-request-id"));
    for other in ["https://evil.example", "http://portal.example.org"] {
        let r = a.send(Method::OPTIONS, "/v1/jobs", &preflight(other)).await;
        assert_eq!(header(&r, "access-control-allow-origin"), None, "{other}");
        let r = a.send(Method::GET, "/healthz", &[("origin", other)]).await;
        assert_eq!(header(&r, "access-control-allow-origin"), None, "{other}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_bodies_are_limited_and_the_webhook_keeps_its_own_limit() {
    let a = app(HttpSettings { max_body: 100, ..HttpSettings::default() }).await;
    let big = format!("{{\"pad\": \"{}\"}}", "x".repeat(500));
    let r = a
        .http
        .post(format!("{}/v1/jobs", a.base))
        .header("content-type", "application/json")
        .body(big.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(header(&r, "content-type").as_deref(), Some("application/problem+json"));
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], "urn:onramp:problem:too-large");
    // not the API's limit: this onramp has no intake, and says so
    let r = a.http.post(format!("{}/webhooks/authentik", a.base)).body(big).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.json::<Value>().await.unwrap()["type"], "urn:onramp:problem:webhook-disabled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_takes_too_long_is_answered_with_a_timeout() {
    let a = app(HttpSettings { timeout: Duration::from_millis(300), ..HttpSettings::default() }).await;
    let token = crate::http_api::token(&a.engine, "ops", onramp::http::access::Role::Operator, None).await;
    // a body announced and never sent: the handler waits for it until the timeout answers
    let mut conn = tokio::net::TcpStream::connect(a.base.trim_start_matches("http://")).await.unwrap();
    let head = format!(
        "POST /v1/jobs HTTP/1.1\r\nhost: onramp\r\nauthorization: Bearer {token}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{"
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    let read = async {
        let mut buf = [0u8; 4096];
        // until the problem's body is in (or the server closes)
        while !String::from_utf8_lossy(&answer).contains('}') {
            match conn.read(&mut buf).await.unwrap() {
                0 => break,
                n => answer.extend_from_slice(&buf[..n]),
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), read).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).to_string();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("urn:onramp:problem:timeout"), "{answer}");
}

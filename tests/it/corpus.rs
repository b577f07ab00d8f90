//! The hostile-request corpus (`tests/corpus/hostile.jsonl`, written by `generate.py` beside it):
//! every request is sent over a raw TCP connection to the API with the webhook intake, and its
//! answer must be one the case allows. For a refused request (4xx, 5xx or a closed connection)
//! nothing may be stored or enqueued and no step may have run (the API process runs commands
//! only through jobs); an accepted delivery may only queue reconcile jobs, which re-read
//! Authentik and trust nothing in the delivery.

use std::collections::BTreeMap;
use std::time::Duration;

use onramp::engine::{Actor, NewJob};
use onramp::http::access::Role;
use onramp::intake::SigningSecret;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::TestDb;
use crate::http_api::token;
use crate::intake_support::{AppOptions, FakeUser, WHSEC, app, now, pumped};

const OTHER_SECRET: &str = "whsec_b3RoZXItc2VjcmV0LW5vdC1vbnJhbXBz";

#[derive(Debug, Deserialize)]
struct Case {
    family: String,
    name: String,
    method: String,
    target: String,
    expect: Vec<u16>,
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    body_hex: Option<String>,
    #[serde(default)]
    generate: Option<String>,
    #[serde(default)]
    sign: Option<String>,
    #[serde(default)]
    framing: Option<String>,
    #[serde(default)]
    fresh_uuid: bool,
    #[serde(default)]
    no_subjects_outside: Option<String>,
    #[serde(default)]
    no_text: Option<String>,
}

/// A generated body: `deep:N`, `deep_obj:N`, `wide:N`, `long_value:N`, `big_json:N`, `group_diff:N`.
fn generate(spec: &str) -> Vec<u8> {
    let (what, n) = spec.split_once(':').expect("gen is what:n");
    let n: usize = n.parse().unwrap();
    let s = match what {
        "deep" => format!("{{\"action\":\"model_updated\",\"a\":{}{}}}", "[".repeat(n), "]".repeat(n)),
        "deep_obj" => format!("{{\"action\":\"model_updated\",{}1{}}}", "\"a\":{".repeat(n), "}".repeat(n)),
        "wide" => {
            let keys: Vec<String> = (0..n).map(|i| format!("\"k{i}\":{i}")).collect();
            format!("{{\"action\":\"model_updated\",{}}}", keys.join(","))
        }
        "long_value" | "big_json" => format!("{{\"action\":\"model_updated\",\"pad\":\"{}\"}}", "a".repeat(n)),
        "group_diff" => {
            let model =
                json!({"app": "authentik_core", "model_name": "group", "pk": "uuid-g", "name": "tenant-foo-users"});
            let diff = json!({"users": {"add": (0..n as i64).map(|i| i + 10_000).collect::<Vec<_>>()}});
            json!({"event_uuid": uuid::Uuid::new_v4().simple().to_string(), "action": "model_updated",
                   "app": "authentik.events.models", "model": model, "context": {"model": model, "diff": diff}})
            .to_string()
        }
        other => panic!("unknown generator {other}"),
    };
    s.into_bytes()
}

fn body_of(c: &Case) -> Vec<u8> {
    if let Some(g) = &c.generate {
        return generate(g);
    }
    if let Some(h) = &c.body_hex {
        return (0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()).collect();
    }
    let mut b = c.body.clone().unwrap_or_default();
    if c.fresh_uuid {
        b = b.replacen("\"event_uuid\": null", &format!("\"event_uuid\": \"{}\"", uuid::Uuid::new_v4().simple()), 1);
    }
    b.into_bytes()
}

/// The webhook signature headers of a case.
fn signature(sign: &str, body: &[u8]) -> Vec<(String, String)> {
    let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
    let key: SigningSecret = WHSEC.parse().unwrap();
    let other: SigningSecret = OTHER_SECRET.parse().unwrap();
    let ts = now();
    let (id, ts, sig) = match sign {
        "good" => (id.clone(), ts.to_string(), key.sign(&id, ts, body)),
        "none" => return vec![],
        "bad" => (id.clone(), ts.to_string(), "v1,c2lnbmF0dXJlLWZvcmdlZC1ieS1hbi1hdHRhY2tlcg==".into()),
        "other_secret" => (id.clone(), ts.to_string(), other.sign(&id, ts, body)),
        "old" => (id.clone(), (ts - 3600).to_string(), key.sign(&id, ts - 3600, body)),
        "future" => (id.clone(), (ts + 3600).to_string(), key.sign(&id, ts + 3600, body)),
        "no_id" => {
            return vec![
                ("webhook-timestamp".into(), ts.to_string()),
                ("webhook-signature".into(), key.sign("", ts, body)),
            ];
        }
        "bad_timestamp" => (id.clone(), "soon".into(), key.sign(&id, ts, body)),
        "replay_other_body" => (id.clone(), ts.to_string(), key.sign(&id, ts, b"{\"action\":\"other\"}")),
        other => panic!("unknown signing {other}"),
    };
    vec![("webhook-id".into(), id), ("webhook-timestamp".into(), ts), ("webhook-signature".into(), sig)]
}

/// Sends the request as raw bytes and returns (status, body); status 0: closed without an answer.
async fn send(addr: &str, c: &Case, tokens: &BTreeMap<&str, String>, ids: &BTreeMap<&str, i64>) -> (u16, String) {
    let mut target = c.target.clone();
    for (k, v) in ids {
        target = target.replace(&format!("{{{k}}}"), &v.to_string());
    }
    let body = body_of(c);
    let mut head = format!("{} {target} HTTP/1.1\r\nhost: corpus.test\r\nconnection: close\r\n", c.method).into_bytes();
    let mut headers: Vec<(String, String)> = c.headers.clone().into_iter().collect();
    match c.auth.as_deref().unwrap_or("none") {
        "none" => {}
        raw if raw.starts_with("raw:") => headers.push(("authorization".into(), raw[4..].to_string())),
        who => headers.push(("authorization".into(), format!("Bearer {}", tokens[who]))),
    }
    if let Some(s) = &c.sign {
        headers.extend(signature(s, &body));
    }
    let framing = c.framing.as_deref().unwrap_or("length");
    let length = headers.iter().find(|(k, _)| k == "content-length-override").map(|(_, v)| v.clone());
    headers.retain(|(k, _)| k != "content-length-override");
    match framing {
        "chunked" | "chunked_truncated" => headers.push(("transfer-encoding".into(), "chunked".into())),
        _ => headers.push(("content-length".into(), length.unwrap_or_else(|| body.len().to_string()))),
    }
    for (k, v) in &headers {
        head.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    let mut payload = head;
    match framing {
        "chunked" => {
            for chunk in body.chunks(64 * 1024) {
                payload.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
                payload.extend_from_slice(chunk);
                payload.extend_from_slice(b"\r\n");
            }
            payload.extend_from_slice(b"0\r\n\r\n");
        }
        "chunked_truncated" => {
            payload.extend_from_slice(format!("{:x}\r\n", body.len() * 2).as_bytes());
            payload.extend_from_slice(&body);
        }
        _ => payload.extend_from_slice(&body),
    }
    let mut s = TcpStream::connect(addr).await.unwrap();
    // the server may answer (e.g. 413) and close before reading everything: a failed write is fine
    let _ = s.write_all(&payload).await;
    if framing.ends_with("truncated") {
        // the client gives up mid-body: the server sees the end of the stream
        let _ = s.shutdown().await;
    }
    match tokio::time::timeout(Duration::from_secs(20), read_response(&mut s)).await {
        Ok(out) => parse_response(&out),
        Err(_) => (999, "no answer within 20 s".into()),
    }
}

/// Reads one response: to the end of its body, or only its head for a live stream.
async fn read_response(s: &mut TcpStream) -> Vec<u8> {
    let mut out = vec![];
    let mut buf = [0u8; 64 * 1024];
    loop {
        let n = s.read(&mut buf).await.unwrap_or(0);
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let head = &text[..end];
            let body = out.len() - end - 4;
            let length =
                head.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse().ok());
            if head.contains("text/event-stream")
                || length.is_some_and(|l: usize| body >= l)
                || (head.contains("transfer-encoding: chunked") && text.ends_with("0\r\n\r\n"))
            {
                return out;
            }
        }
    }
}

fn parse_response(raw: &[u8]) -> (u16, String) {
    let text = String::from_utf8_lossy(raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return (0, String::new());
    };
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    let body = if chunked { dechunk(body) } else { body.to_string() };
    (status, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// (jobs, deliveries, step attempts) stored so far.
async fn counts(pool: &sqlx::PgPool) -> (i64, i64, i64) {
    sqlx::query_as(
        "select (select count(*) from jobs), (select count(*) from webhook_deliveries), (select count(*) from step_runs)",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hostile_request_gets_its_answer_and_changes_nothing() {
    let text = include_str!("../corpus/hostile.jsonl");
    let cases: Vec<Case> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(cases.len() >= 300, "the corpus keeps at least 300 cases ({})", cases.len());

    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    a.add_user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    a.add_user(FakeUser::new(2, "bob", &["tenant-bar-users"]));
    a.add_user(FakeUser::new(3, "akadmin", &[]));
    a.add_user(FakeUser::new(4, "stranger", &[]));
    let e = &a.engine;
    let tokens = BTreeMap::from([
        ("admin", token(e, "c-admin", Role::Admin, None).await),
        ("admin_foo", token(e, "c-admin-foo", Role::Admin, Some("foo")).await),
        ("operator", token(e, "c-operator", Role::Operator, None).await),
        ("operator_foo", token(e, "c-operator-foo", Role::Operator, Some("foo")).await),
        ("viewer_foo", token(e, "c-viewer-foo", Role::Viewer, Some("foo")).await),
    ]);
    let job = |kind: &str, subject: &str| NewJob::new(kind, subject, json!({}), Actor::cli("corpus"));
    let seeded = e
        .enqueue(&[
            job(onramp::flows::user_onboard::USER_ONBOARD, "foo/alice"),
            job(onramp::flows::user_onboard::USER_ONBOARD, "bar/bob"),
            onramp::flows::reconcile::full_job(Actor::cli("corpus"), "corpus"),
        ])
        .await
        .unwrap();
    let ids = BTreeMap::from([("job_foo", seeded[0].id), ("job_bar", seeded[1].id), ("job_reconcile", seeded[2].id)]);
    let addr = a.base.trim_start_matches("http://").to_string();

    let mut failures = vec![];
    let mut families: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for c in &cases {
        // what an earlier accepted delivery leads to is the pump's to do before this case counts
        pumped(e).await;
        let before = counts(e.pool()).await;
        let last_job: i64 =
            sqlx::query_scalar("select coalesce(max(id), 0) from jobs").fetch_one(e.pool()).await.unwrap();
        let (status, body) = send(&addr, c, &tokens, &ids).await;
        let mut why = vec![];
        if !c.expect.contains(&status) {
            let shown: String = body.chars().take(300).collect();
            why.push(format!("answered {status}, expected {:?}: {shown}", c.expect));
        }
        if status == 0 || status >= 400 {
            let after = counts(e.pool()).await;
            if after != before {
                why.push(format!("refused, yet (jobs, deliveries, attempts) went {before:?} -> {after:?}"));
            }
        } else if c.target.starts_with("/webhooks/") {
            pumped(e).await;
            let kinds: Vec<String> = sqlx::query_scalar("select kind from jobs where id > $1")
                .bind(last_job)
                .fetch_all(e.pool())
                .await
                .unwrap();
            if let Some(k) = kinds.iter().find(|k| !k.starts_with("reconcile.")) {
                why.push(format!("a delivery queued a {k} job directly"));
            }
        }
        if let Some(prefix) = &c.no_subjects_outside
            && let Ok(v) = serde_json::from_str::<Value>(&body)
        {
            let outside: Vec<&str> = v["jobs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|j| j["subject"].as_str())
                .filter(|s| !s.starts_with(prefix.as_str()))
                .collect();
            if !outside.is_empty() {
                why.push(format!("shows subjects outside {prefix}: {outside:?}"));
            }
        }
        if let Some(t) = &c.no_text
            && body.contains(t.as_str())
        {
            why.push(format!("the answer reveals {t:?}"));
        }
        let f = families.entry(c.family.as_str()).or_default();
        f.0 += 1;
        if why.is_empty() {
            f.1 += 1;
        } else {
            failures.push(format!("{} / {}: {}", c.family, c.name, why.join("; ")));
        }
    }
    println!("corpus: {} cases", cases.len());
    for (family, (n, ok)) in &families {
        println!("  {family:<14} {ok:>4} of {n:>4} as expected");
    }
    assert!(failures.is_empty(), "{} of {} cases failed:\n{}", failures.len(), cases.len(), failures.join("\n"));
}

//! POST /webhooks/authentik: authentication, limits, problem+json, dedupe, one transaction.

use std::time::Duration;

use base64::Engine as _;
use onramp::domain::secret::Secret;
use onramp::intake::WebhookAuth;
use serde_json::{Value, json};

use crate::common::TestDb;
use crate::intake_support::*;

async fn problem(r: reqwest::Response, status: u16, kind: &str) -> Value {
    assert_eq!(r.status().as_u16(), status);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["type"], format!("urn:onramp:problem:{kind}"), "{p}");
    p
}

async fn deliveries(app: &App) -> i64 {
    sqlx::query_scalar("select count(*) from webhook_deliveries").fetch_one(app.engine.pool()).await.unwrap()
}

#[tokio::test]
async fn signed_delivery_is_stored_with_its_reconcile_job_and_answered_202() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let body = structured("11111111111111111111111111111111", "model_updated", user_model(42), None);
    let r = app.post_signed(&body, None).await;
    assert_eq!(r.status().as_u16(), 202);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["duplicate"], false);
    let id = v["delivery"].as_str().unwrap().to_string();
    let jobs = app.jobs("reconcile.user").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].2.as_deref(), Some("reconcile.user:42"));
    assert_eq!(jobs[0].3["pk"], 42);
    let (key, action, model): (String, String, String) =
        sqlx::query_as("select delivery_key, action, model from webhook_deliveries where id = $1::uuid")
            .bind(&id)
            .fetch_one(app.engine.pool())
            .await
            .unwrap();
    assert_eq!(
        (key.as_str(), action.as_str(), model.as_str()),
        ("event:11111111111111111111111111111111", "model_updated", "authentik_core.user")
    );
    let actor: String = sqlx::query_scalar("select created_by from jobs where id = $1")
        .bind(jobs[0].0)
        .fetch_one(app.engine.pool())
        .await
        .unwrap();
    assert_eq!(actor, format!("webhook:{id}"));
}

#[tokio::test]
async fn duplicates_get_200_and_change_nothing_even_when_concurrent() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let body = structured("22222222222222222222222222222222", "model_updated", user_model(7), None);
    // Authentik's retries re-run the header mapping: a new timestamp, the same event
    let first = app.post_signed(&body, Some("evt_22")).await;
    assert_eq!(first.status().as_u16(), 202);
    let first: Value = first.json().await.unwrap();
    let again = app.post_signed(&body, Some("evt_22")).await;
    assert_eq!(again.status().as_u16(), 200);
    let again: Value = again.json().await.unwrap();
    assert_eq!((again["delivery"].clone(), again["duplicate"].clone()), (first["delivery"].clone(), json!(true)));

    // a storm of the same new event at once: one stored, one job
    let storm = structured("33333333333333333333333333333333", "model_updated", user_model(8), None);
    let codes: Vec<u16> = futures_join(&app, &storm, 20).await;
    assert_eq!(codes.iter().filter(|c| **c == 202).count(), 1, "{codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == 200).count(), 19, "{codes:?}");
    assert_eq!(deliveries(&app).await, 2);
    assert_eq!(app.jobs("reconcile.user").await.len(), 2);
}

async fn futures_join(app: &App, body: &Value, n: usize) -> Vec<u16> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let (http, url, raw) = (app.http.clone(), app.url.clone(), serde_json::to_vec(body).unwrap());
        set.spawn(async move {
            let key: onramp::intake::SigningSecret = WHSEC.parse().unwrap();
            let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
            let ts = now();
            http.post(&url)
                .header("content-type", "application/json")
                .header("webhook-id", &id)
                .header("webhook-timestamp", ts.to_string())
                .header("webhook-signature", key.sign(&id, ts, &raw))
                .body(raw)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        });
    }
    set.join_all().await
}

#[tokio::test]
async fn many_concurrent_deliveries_are_all_stored_once() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..200 {
        let (http, url) = (app.http.clone(), app.url.clone());
        set.spawn(async move {
            let body = structured(&format!("{i:032x}"), "model_updated", user_model(1000 + i), None);
            let raw = serde_json::to_vec(&body).unwrap();
            let key: onramp::intake::SigningSecret = WHSEC.parse().unwrap();
            let id = format!("msg_{i}");
            let ts = now();
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
            r.status().as_u16()
        });
    }
    let codes = set.join_all().await;
    assert!(codes.iter().all(|c| *c == 202), "{codes:?}");
    assert_eq!(deliveries(&app).await, 200);
    assert_eq!(app.jobs("reconcile.user").await.len(), 200);
}

#[tokio::test]
async fn failed_authentication_is_401_without_a_hint_and_counted() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let raw = serde_json::to_vec(&structured("44444444444444444444444444444444", "model_updated", user_model(1), None))
        .unwrap();
    let wrong = "whsec_c2VjcmV0LXRoYXQtaXMtbm90LW91cnMtYXQtYWxs";
    let mut details = vec![];
    for r in [
        app.post_raw(&raw, "msg_a", now(), wrong).await,
        app.post_raw(&raw, "msg_b", now() - 600, WHSEC).await,
        app.post_raw(&raw, "msg_c", now() + 600, WHSEC).await,
        app.http.post(&app.url).header("content-type", "application/json").body(raw.clone()).send().await.unwrap(),
        app.http
            .post(&app.url)
            .header("content-type", "application/json")
            .header("webhook-id", "msg_d")
            .header("webhook-timestamp", now().to_string())
            .header("webhook-signature", "v1,")
            .body(raw.clone())
            .send()
            .await
            .unwrap(),
    ] {
        let p = problem(r, 401, "unauthorized").await;
        details.push(p["detail"].as_str().unwrap().to_string());
    }
    // the same answer whatever failed
    details.dedup();
    assert_eq!(details, ["the delivery is not authenticated"]);
    assert_eq!(deliveries(&app).await, 0);
    let metrics =
        app.http.get(app.url.replace("/webhooks/authentik", "/metrics")).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("onramp_webhook_deliveries_total{result=\"unauthorized\"} 5"), "{metrics}");
}

#[tokio::test]
async fn size_type_and_json_are_checked_with_problem_details() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions { max_body: 1024, ..Default::default() }).await;
    let big = json!({ "action": "model_updated", "pad": "x".repeat(2000) });
    problem(app.post_signed(&big, None).await, 413, "payload-too-large").await;
    let r = app.http.post(&app.url).header("content-type", "text/plain").body("{}").send().await.unwrap();
    problem(r, 415, "unsupported-media-type").await;
    let r = app.post_raw(b"{\"action\": ", "msg_x", now(), WHSEC).await;
    let p = problem(r, 400, "malformed-json").await;
    assert!(!p.to_string().contains("whsec"), "{p}");
    let r = app.post_raw(b"[1, 2]", "msg_y", now(), WHSEC).await;
    problem(r, 400, "invalid-body").await;
    // charset parameters are fine
    let raw = br#"{"action": "login", "event_uuid": "55555555555555555555555555555555"}"#;
    let key: onramp::intake::SigningSecret = WHSEC.parse().unwrap();
    let ts = now();
    let r = app
        .http
        .post(&app.url)
        .header("content-type", "application/json; charset=utf-8")
        .header("webhook-id", "msg_z")
        .header("webhook-timestamp", ts.to_string())
        .header("webhook-signature", key.sign("msg_z", ts, raw))
        .body(raw.to_vec())
        .send()
        .await
        .unwrap();
    // an action onramp does not act on: stored and acknowledged, no job
    assert_eq!(r.status().as_u16(), 202);
    assert_eq!(deliveries(&app).await, 1);
    assert_eq!(app.jobs("reconcile.user").await.len() + app.jobs("reconcile.full").await.len(), 0);
}

#[tokio::test]
async fn bearer_tokens_with_rotation() {
    let db = TestDb::new().await;
    let auth = WebhookAuth {
        signing_secrets: vec![],
        bearer_tokens: vec![Secret::new("old-hook-token"), Secret::new("new-hook-token")],
        tolerance: Duration::from_secs(300),
    };
    let app = app(&db, AppOptions { auth, ..Default::default() }).await;
    // Authentik's default body: no id, no structure; reconcile everything
    let body = json!({"body": "model_updated: {'model': {'app': 'authentik_core', 'model_name': 'user', 'pk': 42}}",
                      "severity": "notice", "user_email": "ops@example.org", "user_username": "ops",
                      "event_user_email": "root@example.org", "event_user_username": "akadmin"});
    let send = |token: Option<&'static str>| {
        let req = app.http.post(&app.url).header("content-type", "application/json").json(&body);
        let req = match token {
            Some(t) => req.header("authorization", format!("Bearer {t}")),
            None => req,
        };
        async move { req.send().await.unwrap() }
    };
    assert_eq!(send(Some("new-hook-token")).await.status().as_u16(), 202);
    // the same bytes within the hour: a retry
    assert_eq!(send(Some("old-hook-token")).await.status().as_u16(), 200);
    problem(send(Some("new-hook-tokeN")).await, 401, "unauthorized").await;
    problem(send(None).await, 401, "unauthorized").await;
    assert_eq!(app.jobs("reconcile.full").await.len(), 1);
}

/// The blueprint's mappings, run by python3 on a stand-in notification, sign the very bytes
/// Authentik's `requests` call sends; the service accepts them, and one changed byte is refused.
#[tokio::test]
async fn the_shipped_header_mapping_signs_what_authentik_sends() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let bp: serde_yaml_ng::Value = serde_yaml_ng::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/authentik/onramp-blueprint.yaml"))
            .unwrap(),
    )
    .unwrap();
    let entries = bp["entries"].as_sequence().unwrap();
    let entry =
        |id: &str| entries.iter().find(|e| e["id"].as_str() == Some(id)).unwrap_or_else(|| panic!("no entry {id}"));
    let body_expr = entry("onramp-body")["attrs"]["expression"].as_str().unwrap().to_string();
    let serde_yaml_ng::Value::Tagged(fmt) = &entry("onramp-headers")["attrs"]["expression"] else {
        panic!("!Format expected")
    };
    assert_eq!(fmt.tag.to_string(), "!Format");
    let header_fmt = fmt.value[0].as_str().unwrap().to_string();
    let serde_yaml_ng::Value::Tagged(env) = &fmt.value[1] else { panic!("!Env expected") };
    assert_eq!((env.tag.to_string().as_str(), env.value[0].as_str()), ("!Env", Some("ONRAMP_WEBHOOK_SECRET")));
    assert_eq!(entry("onramp-transport")["attrs"]["send_once"].as_bool(), Some(true));

    let dir = std::env::temp_dir().join(format!("onramp-mapping-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("body.py"), body_expr).unwrap();
    std::fs::write(dir.join("headers.py"), header_fmt).unwrap();
    let context = json!({"model": {"app": "authentik_core", "model_name": "user", "pk": 42, "name": "Zoë Ünicode"},
                         "http_request": {"path": "/api/v3/core/users/42/", "method": "PATCH"}});
    std::fs::write(dir.join("context.json"), context.to_string()).unwrap();
    let out = std::process::Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/fixtures/run_mapping.py"))
        .args([dir.join("body.py"), dir.join("headers.py"), dir.join("context.json")])
        .env("ONRAMP_WEBHOOK_SECRET", WHSEC)
        .output()
        .expect("python3 runs");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let raw = base64::engine::general_purpose::STANDARD.decode(v["body"].as_str().unwrap()).unwrap();
    // requests' encoding: default separators, ASCII escapes
    assert!(std::str::from_utf8(&raw).unwrap().contains("\"action\": \"model_updated\", \"app\""));
    assert!(std::str::from_utf8(&raw).unwrap().contains("Zo\\u00eb"));
    let h = &v["headers"];
    assert_eq!(h["webhook-id"], "evt_6f1c0d5e-9a8b-4c3d-8e7f-6a5b4c3d2e1f");
    let post = |raw: Vec<u8>| {
        app.http
            .post(&app.url)
            .header("content-type", "application/json")
            .header("webhook-id", h["webhook-id"].as_str().unwrap())
            .header("webhook-timestamp", h["webhook-timestamp"].as_str().unwrap())
            .header("webhook-signature", h["webhook-signature"].as_str().unwrap())
            .body(raw)
            .send()
    };
    let mut tampered = raw.clone();
    let at = tampered.len() / 2;
    tampered[at] ^= 0x01;
    problem(post(tampered).await.unwrap(), 401, "unauthorized").await;
    let r = post(raw).await.unwrap();
    assert_eq!(r.status().as_u16(), 202, "via {}", v["via"]);
    let jobs = app.jobs("reconcile.user").await;
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].3["pk"], 42);
}

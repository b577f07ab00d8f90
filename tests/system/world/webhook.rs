//! Authentik's webhook deliveries as its notification transport sends them with the blueprint's
//! mapping (deploy/authentik), signed per Standard Webhooks, written here independently of onramp.

use base64::Engine as _;
use hmac::{Hmac, Mac};
use serde_json::{Value, json};
use sha2::Sha256;

/// The signing secret of the world (Standard Webhooks `whsec_<base64 key>`).
pub const WHSEC: &str = "whsec_c3lzdGVtLXRlc3Qtc2lnbmluZy1rZXktMDAwMQ==";

/// The `webhook-signature` header: `v1,<base64 HMAC-SHA256(key, "<id>.<ts>.<body>")>`.
pub fn signature(secret: &str, id: &str, ts: i64, body: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD;
    let key = b64.decode(secret.strip_prefix("whsec_").expect("a whsec_ secret")).expect("base64 key");
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).unwrap();
    mac.update(format!("{id}.{ts}.").as_bytes());
    mac.update(body);
    format!("v1,{}", b64.encode(mac.finalize().into_bytes()))
}

fn event(action: &str, model: Value, diff: Option<Value>) -> Value {
    let uuid = uuid::Uuid::new_v4().simple().to_string();
    let mut context = json!({ "model": model, "http_request": { "path": "/api/v3/core/users/", "method": "POST",
                                                                "request_id": uuid, "user_agent": "system-test" } });
    if let Some(d) = &diff {
        context["diff"] = d.clone();
    }
    json!({ "event_uuid": uuid, "action": action, "app": "authentik.events.models", "model": model,
            "diff": diff, "actor": { "pk": 1, "username": "akadmin", "email": "root@example.org" },
            "context": context, "created": "2026-11-30T00:00:00+00:00" })
}

/// "User created".
pub fn user_created(pk: i64, username: &str) -> Value {
    event("model_created", json!({"app": "authentik_core", "model_name": "user", "pk": pk, "name": username}), None)
}

/// "Group updated", with the members added.
pub fn group_members_added(group_pk: &str, name: &str, pks: &[i64]) -> Value {
    event(
        "model_updated",
        json!({"app": "authentik_core", "model_name": "group", "pk": group_pk, "name": name}),
        Some(json!({"users": {"add": pks}})),
    )
}

/// "Group updated", with the members removed.
pub fn group_members_removed(group_pk: &str, name: &str, pks: &[i64]) -> Value {
    event(
        "model_updated",
        json!({"app": "authentik_core", "model_name": "group", "pk": group_pk, "name": name}),
        Some(json!({"users": {"remove": pks}})),
    )
}

/// One signed delivery: (webhook-id, timestamp, body bytes, signature).
pub struct Delivery {
    pub id: String,
    pub ts: i64,
    pub body: Vec<u8>,
}

impl Delivery {
    pub fn new(body: &Value) -> Self {
        let ts = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
        Self { id: format!("msg_{}", uuid::Uuid::new_v4().simple()), ts, body: serde_json::to_vec(body).unwrap() }
    }

    pub async fn send(&self, http: &reqwest::Client, url: &str) -> reqwest::StatusCode {
        let r = http
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", &self.id)
            .header("webhook-timestamp", self.ts.to_string())
            .header("webhook-signature", signature(WHSEC, &self.id, self.ts, &self.body))
            .body(self.body.clone())
            .send()
            .await;
        r.map(|r| r.status()).unwrap_or_else(|e| panic!("POST {url}: {e}"))
    }
}

//! `POST /webhooks/authentik`: size and content type first, then authentication over the raw
//! bytes, then parsing; the delivery is stored (its row and its pending id, in a shared transaction: see
//! `intake::writer`) before the 202, and the pump (`intake::pump`) enqueues its reconcile jobs. A delivery PostgreSQL refuses is a 422
//! (Authentik should not send it again), never a 503.

use std::net::SocketAddr;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::to_bytes;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tracing::Instrument;

use super::{Problem, Route, Shared, route};
use crate::intake::{AuthHeaders, Delivery, WriteError, event};

pub fn routes() -> Vec<Route> {
    // the intake's own limit (ONRAMP_WEBHOOK_MAX_BODY), answered with its own problem
    vec![route(Method::POST, "/webhooks/authentik", authentik).own_body_limit()]
}

/// Whether reading the body stopped at the limit (not at a body cut short or stalled).
fn over_limit(e: &axum::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        if c.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

async fn authentik(State(s): State<Shared>, req: Request) -> Response {
    let Some(intake) = s.intake.clone() else {
        return Problem::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "webhook-disabled",
            "Webhook intake disabled",
            "this onramp has no Authentik intake configured",
        )
        .into_response();
    };
    let (parts, body) = req.into_parts();
    let remote = parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.to_string());
    let h = &parts.headers;
    let reject = |p: Problem| {
        intake.stats.rejected.fetch_add(1, Relaxed);
        p.into_response()
    };
    let too_large = || {
        Problem::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload-too-large",
            "Payload too large",
            format!("the body may be at most {} bytes", intake.max_body),
        )
    };
    if header(h, "content-length").and_then(|v| v.parse::<usize>().ok()).is_some_and(|n| n > intake.max_body) {
        return reject(too_large());
    }
    let ctype = header(h, "content-type").unwrap_or("");
    let essence = ctype.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    if essence != "application/json" {
        return reject(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported-media-type",
            "Unsupported media type",
            "the body must be application/json",
        ));
    }
    let raw = match to_bytes(body, intake.max_body).await {
        Ok(b) => b,
        Err(e) if over_limit(&e) => return reject(too_large()),
        Err(e) => {
            return reject(Problem::new(
                StatusCode::BAD_REQUEST,
                "incomplete-body",
                "Incomplete body",
                format!("the body could not be read to its end: {}", e.into_inner()),
            ));
        }
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    let auth = AuthHeaders {
        webhook_id: header(h, "webhook-id"),
        webhook_timestamp: header(h, "webhook-timestamp"),
        webhook_signature: header(h, "webhook-signature"),
        authorization: header(h, header::AUTHORIZATION.as_str()),
    };
    let verified = match intake.auth.verify(&auth, &raw, now) {
        Ok(v) => v,
        Err(why) => {
            intake.stats.auth_failures.fetch_add(1, Relaxed);
            tracing::warn!(
                remote = remote.as_deref().unwrap_or("?"),
                forwarded_for = header(h, "x-forwarded-for").unwrap_or(""),
                reason = why.kind(),
                "webhook authentication failed"
            );
            return Problem::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "Unauthorized",
                "the delivery is not authenticated",
            )
            .into_response();
        }
    };
    let mut body: Value = match serde_json::from_slice(&raw) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return reject(Problem::new(
                StatusCode::BAD_REQUEST,
                "invalid-body",
                "Invalid body",
                "the body must be a JSON object",
            ));
        }
        Err(e) => {
            return reject(Problem::new(
                StatusCode::BAD_REQUEST,
                "malformed-json",
                "Malformed JSON",
                format!("the body is not JSON: line {} column {}", e.line(), e.column()),
            ));
        }
    };
    // jsonb cannot hold U+0000: stored as U+FFFD, with the bytes as received kept beside
    let raw_body = event::scrub_nul(&mut body).then(|| raw.to_vec());
    let parsed = event::parse(&body, intake.max_diff_users);
    let id = uuid::Uuid::now_v7();
    let key = event::delivery_key(&parsed, verified.webhook_id.as_deref(), &raw, now);
    // the delivery's span: stored with it, the reconcile jobs carry it, so their steps join this
    // request's trace
    let span = tracing::info_span!("delivery", delivery = %id, shape = parsed.shape, action = parsed.action.as_deref());
    let traceparent = span.in_scope(crate::engine::trace::current);
    let targets = json!(parsed.subjects.iter().map(|t| t.to_target()).collect::<Vec<_>>());
    let delivery = Delivery {
        id,
        key,
        remote_addr: remote,
        shape: parsed.shape,
        action: parsed.action.clone(),
        model: parsed.model.clone(),
        body,
        raw_body,
        targets,
        traceparent,
    };
    match intake.writer.store(delivery).instrument(span).await {
        Ok(stored) if stored.duplicate => {
            intake.stats.duplicates.fetch_add(1, Relaxed);
            (StatusCode::OK, Json(json!({ "delivery": stored.id, "duplicate": true }))).into_response()
        }
        Ok(stored) => {
            intake.stats.accepted.fetch_add(1, Relaxed);
            (StatusCode::ACCEPTED, Json(json!({ "delivery": stored.id, "duplicate": false }))).into_response()
        }
        Err(WriteError::Refused(why)) => reject(Problem::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "unstorable-delivery",
            "Unstorable delivery",
            format!("{why}; sending it again will not help"),
        )),
        Err(e) => {
            intake.stats.store_failures.fetch_add(1, Relaxed);
            tracing::error!(error = %e, "webhook delivery not stored");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Unavailable",
                "the delivery could not be stored; retry",
            )
            .into_response()
        }
    }
}

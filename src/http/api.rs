//! The /v1 API: jobs, their steps and audit trail; cancel, retry and approve.
//! Bearer auth with the configured token (database-backed tokens with roles come later).

use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::{AppState, Problem};
use crate::config::constant_time_eq;
use crate::engine::{Actor, Job, JobFilter, JobState};

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/jobs", get(list))
        .route("/jobs/{id}", get(show))
        .route("/jobs/{id}/cancel", post(cancel))
        .route("/jobs/{id}/retry", post(retry))
        .route("/jobs/{id}/approve", post(approve))
}

/// The caller, authenticated by bearer token.
pub struct Caller(Actor);

impl FromRequestParts<AppState> for Caller {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        let Some(expected) = &state.api_token else {
            return Err(Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "api-disabled",
                "API disabled",
                "no API token is configured (ONRAMP_API_TOKEN)",
            ));
        };
        let given = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if constant_time_eq(given.as_bytes(), expected.expose().as_bytes()) {
            Ok(Caller(Actor::api("static-token")))
        } else {
            tracing::info!(path = %parts.uri.path(), "API authentication failed");
            Err(Problem::unauthorized())
        }
    }
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    state: Option<String>,
    kind: Option<String>,
    subject: Option<String>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    created_since: Option<OffsetDateTime>,
    /// Keyset cursor: the `next` of the previous page.
    before: Option<i64>,
    limit: Option<u32>,
}

async fn list(_: Caller, State(s): State<AppState>, Query(q): Query<ListQuery>) -> Result<Json<Value>, Problem> {
    let state = q.state.as_deref().map(str::parse::<JobState>).transpose().map_err(Problem::bad_request)?;
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
    let filter =
        JobFilter { state, kind: q.kind, subject: q.subject, created_since: q.created_since, before_id: q.before, limit };
    let jobs = s.engine.list(&filter).await?;
    let next = (jobs.len() == limit as usize).then(|| jobs.last().map(|j| j.id)).flatten();
    Ok(Json(json!({ "jobs": jobs, "next": next })))
}

async fn show(_: Caller, State(s): State<AppState>, Path(id): Path<i64>) -> Result<Json<Value>, Problem> {
    let job = s.engine.job(id).await?;
    let steps = s.engine.step_runs(id).await?;
    let events = s.engine.events(id).await?;
    Ok(Json(json!({ "job": job, "steps": steps, "events": events })))
}

#[derive(Debug, Default, Deserialize)]
struct CancelBody {
    reason: Option<String>,
}

async fn cancel(
    Caller(actor): Caller,
    State(s): State<AppState>,
    Path(id): Path<i64>,
    body: Option<Json<CancelBody>>,
) -> Result<Json<Job>, Problem> {
    let reason = body.and_then(|b| b.0.reason);
    Ok(Json(s.engine.cancel(id, &actor, reason.as_deref()).await?))
}

async fn retry(Caller(actor): Caller, State(s): State<AppState>, Path(id): Path<i64>) -> Result<Json<Job>, Problem> {
    Ok(Json(s.engine.retry(id, &actor).await?))
}

async fn approve(Caller(actor): Caller, State(s): State<AppState>, Path(id): Path<i64>) -> Result<Json<Job>, Problem> {
    Ok(Json(s.engine.approve(id, &actor).await?))
}

//! Liveness (the process answers) and readiness (the database answers).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use super::{AppState, Problem};

pub fn router() -> Router<AppState> {
    Router::new().route("/healthz", get(|| async { "ok\n" })).route("/readyz", get(ready))
}

async fn ready(State(s): State<AppState>) -> Result<&'static str, Problem> {
    sqlx::query("select 1").execute(s.engine.pool()).await.map_err(|e| {
        tracing::warn!(error = %e, "readiness: database unreachable");
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not-ready", "Not ready", "the database does not answer")
    })?;
    Ok("ready\n")
}

//! Liveness (the process answers) and readiness (the database answers).

use axum::extract::State;
use axum::http::{Method, StatusCode};

use super::{AppState, Problem, Route, route};

pub fn routes() -> Vec<Route> {
    vec![route(Method::GET, "/healthz", || async { "ok\n" }), route(Method::GET, "/readyz", ready)]
}

async fn ready(State(s): State<AppState>) -> Result<&'static str, Problem> {
    s.engine.ping().await.map_err(|e| {
        tracing::warn!(error = %e, "readiness: database unreachable");
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not-ready", "Not ready", "the database does not answer")
    })?;
    Ok("ready\n")
}

//! Liveness (the process answers) and readiness (the database answers), saying which kinds this
//! process runs (claims) and which it accepts (enqueues for workers that run them).

use axum::extract::State;
use axum::http::{Method, StatusCode};

use super::{AppState, Problem, Route, route};

pub fn routes() -> Vec<Route> {
    vec![route(Method::GET, "/healthz", || async { "ok\n" }), route(Method::GET, "/readyz", ready)]
}

async fn ready(State(s): State<AppState>) -> Result<axum::Json<serde_json::Value>, Problem> {
    s.engine.ping().await.map_err(|e| {
        tracing::warn!(error = %e, "readiness: database unreachable");
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not-ready", "Not ready", "the database does not answer")
    })?;
    let registry = s.engine.registry();
    let runs = if s.worker { registry.runnable_kinds() } else { vec![] };
    Ok(axum::Json(serde_json::json!({
        "status": "ready",
        "worker": s.worker,
        "runs": runs,
        "accepts": registry.kinds(),
    })))
}

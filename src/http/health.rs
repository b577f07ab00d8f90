//! Liveness (the process answers) and readiness (the database answers within a second), saying which kinds this
//! process runs (claims) and which it accepts (enqueues for workers that run them).

use std::time::Duration;

use axum::extract::State;
use axum::http::{Method, StatusCode};

use super::{Problem, Route, Shared, route};

pub fn routes() -> Vec<Route> {
    vec![route(Method::GET, "/healthz", || async { "ok\n" }), route(Method::GET, "/readyz", ready)]
}

/// How long readiness waits for the database (whatever the pool's own wait for a connection).
const READY_TIMEOUT: Duration = Duration::from_secs(1);

async fn ready(State(s): State<Shared>) -> Result<axum::Json<serde_json::Value>, Problem> {
    let not_ready = |detail: &str| Problem::new(StatusCode::SERVICE_UNAVAILABLE, "not-ready", "Not ready", detail);
    match tokio::time::timeout(READY_TIMEOUT, s.engine.ping()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "readiness: database unreachable");
            return Err(not_ready("the database does not answer"));
        }
        Err(_) => {
            tracing::warn!("readiness: the database did not answer within {READY_TIMEOUT:?}");
            return Err(not_ready("the database did not answer within a second"));
        }
    }
    let registry = s.engine.registry();
    let runs = if s.worker { registry.runnable_kinds() } else { vec![] };
    Ok(axum::Json(serde_json::json!({
        "status": "ready",
        "worker": s.worker,
        "runs": runs,
        "accepts": registry.kinds(),
    })))
}

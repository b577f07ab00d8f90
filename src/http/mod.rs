//! HTTP: health and metrics, the /v1 API. Each area has its own router.

mod api;
mod health;
mod metrics;
mod problem;

use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Secret;
use crate::engine::{Engine, WorkerStats};

pub use problem::Problem;

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub stats: Arc<WorkerStats>,
    pub api_token: Option<Secret>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::router())
        .merge(metrics::router())
        .nest("/v1", api::router())
        .fallback(|| async { Problem::not_found("no such route") })
        .with_state(state)
}

/// Serves until `shutdown` is cancelled, then finishes the requests in flight.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

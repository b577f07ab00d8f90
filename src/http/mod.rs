//! HTTP: health and metrics, the Authentik webhook, the /v1 API. Each area has its own router.

mod api;
mod health;
mod metrics;
mod problem;
mod webhook;

use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::Secret;
use crate::engine::{Engine, WorkerStats};
use crate::intake::Intake;

pub use problem::Problem;

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub stats: Arc<WorkerStats>,
    pub api_token: Option<Secret>,
    /// The Authentik webhook intake, when configured.
    pub intake: Option<Arc<Intake>>,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .merge(health::router())
        .merge(metrics::router())
        .merge(webhook::router())
        .nest("/v1", api::router())
        .fallback(|| async { Problem::not_found("no such route") })
        .with_state(state)
}

/// Serves until `shutdown` is cancelled, then finishes the requests in flight.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    axum::serve(listener, router(state).into_make_service_with_connect_info::<std::net::SocketAddr>())
        .with_graceful_shutdown(shutdown.cancelled_owned()).await
}

//! HTTP: health and metrics, the Authentik webhook, the /v1 API (jobs, tokens), the dashboard.
//! Each area lists its routes; the router is built from that one table, so the table is exactly
//! what is served (and a test compares it with openapi.yaml).

mod auth;
mod dashboard;
mod health;
mod jobs;
mod metrics;
mod problem;
mod tokens;
mod webhook;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter, on};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::engine::{Engine, WorkerStats};
use crate::intake::Intake;

pub use auth::AuthLimiter;
pub use problem::Problem;

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub stats: Arc<WorkerStats>,
    pub limiter: Arc<AuthLimiter>,
    /// The Authentik webhook intake, when configured.
    pub intake: Option<Arc<Intake>>,
}

impl AppState {
    pub fn new(engine: Engine, stats: Arc<WorkerStats>) -> Self {
        Self { engine, stats, limiter: Arc::new(AuthLimiter::default()), intake: None }
    }
}

/// One served route.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    handler: MethodRouter<AppState>,
}

pub(crate) fn route<H, T>(method: Method, path: &'static str, handler: H) -> Route
where
    H: axum::handler::Handler<T, AppState>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("a standard method");
    Route { method, path, handler: on(filter, handler) }
}

/// Every route onramp serves.
pub fn routes() -> Vec<Route> {
    let areas =
        [health::routes(), metrics::routes(), jobs::routes(), tokens::routes(), webhook::routes(), dashboard::routes()];
    areas.into_iter().flatten().collect()
}

pub fn router(state: AppState) -> Router {
    let mut r = Router::new();
    for route in routes() {
        r = r.route(route.path, route.handler);
    }
    r.fallback(|| async { Problem::not_found("no such route") }).with_state(state)
}

/// Serves until `shutdown` is cancelled, then finishes the requests in flight.
pub async fn serve(listener: TcpListener, state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    let app = router(state).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
}

//! HTTP: health and metrics, the Authentik webhook, the /v1 API (jobs, starting work, tenants, their
//! users, drift, tokens, callbacks), the dashboard.
//! Each area lists its routes; the router is built from that one table, so the table is exactly
//! what is served (and a test compares it with openapi.yaml).

pub mod access;
mod auth;
mod callbacks;
mod dashboard;
mod deliveries;
mod extract;
mod health;
mod idempotency;
mod jobs;
mod layers;
mod metrics;
mod params;
mod plans;
mod problem;
mod server;
mod source;
mod stream;
mod tenants;
mod tokens;
mod users;
mod webhook;
mod work;

use std::sync::Arc;

use axum::Router;
use axum::http::Method;
use axum::routing::{MethodFilter, MethodRouter, on};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::domain::tenants::TenantRegistry;
use crate::engine::{Engine, WorkerStats};
use crate::intake::Intake;

pub use auth::AuthLimiter;
pub use layers::{HttpSettings, parse_origin};
pub use problem::Problem;
pub use source::IpNet;
pub use stream::{JobHub, StreamSlots};

#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub stats: Arc<WorkerStats>,
    pub limiter: Arc<AuthLimiter>,
    /// The Authentik webhook intake, when configured.
    pub intake: Option<Arc<Intake>>,
    /// The tenant registry (`ONRAMP_TENANTS`), when configured: starting work and the tenants
    /// overview need it.
    pub tenants: Option<Arc<TenantRegistry>>,
    /// Plans of flows (the simulated cluster with this process's settings), when configured.
    pub plans: Option<Arc<crate::dryrun::plan::Planner>>,
    /// Authentik (read only here: who is a member of which tenant), with the intake.
    pub authentik: Option<Arc<dyn crate::backends::authentik::Authentik>>,
    /// This process runs a worker (it claims the runnable kinds of its registry).
    pub worker: bool,
    /// Timeouts, limits and CORS of the server and its routes.
    pub http: Arc<HttpSettings>,
    /// The live job streams open per token.
    pub streams: Arc<StreamSlots>,
    /// The one poller of the live job streams.
    pub jobs: Arc<JobHub>,
    /// Cancelled when the server shuts down (live streams end).
    pub shutdown: CancellationToken,
}

/// The router's state: one `Arc`, so a request's copy of it is one reference count (cloning
/// `AppState`'s dozen handles for every request was a twentieth of the server's CPU in the intake).
pub type Shared = Arc<AppState>;

impl AppState {
    pub fn new(engine: Engine, stats: Arc<WorkerStats>) -> Self {
        Self {
            engine,
            stats,
            limiter: Arc::new(AuthLimiter::default()),
            intake: None,
            tenants: None,
            plans: None,
            authentik: None,
            worker: false,
            http: Arc::default(),
            streams: Arc::default(),
            jobs: Arc::default(),
            shutdown: CancellationToken::new(),
        }
    }

    pub fn with_tenants(mut self, tenants: Arc<TenantRegistry>) -> Self {
        self.tenants = Some(tenants);
        self
    }

    /// The tenant a new scoped thing (a token, a subscription) is for, checked: a scoped caller
    /// makes them for its own tenant only (403 with `refused(own)`), and a scope names a tenant
    /// of the registry (422): one for any other name would see what is no tenant's.
    fn check_scope(
        &self,
        p: &access::Principal,
        tenant: Option<&crate::domain::names::TenantName>,
        refused: impl FnOnce(&str) -> String,
    ) -> Result<(), Problem> {
        if let Some(own) = &p.tenant
            && tenant.map(|t| t.as_str()) != Some(own.as_str())
        {
            return Err(Problem::new(axum::http::StatusCode::FORBIDDEN, "forbidden", "Forbidden", refused(own)));
        }
        if let Some(t) = tenant
            && self.registry()?.tenant(t.as_str()).is_none()
        {
            return Err(Problem::unprocessable(format!("tenant {t} is not in the tenant registry")));
        }
        Ok(())
    }

    /// The tenant registry, or 503 naming the setting.
    fn registry(&self) -> Result<&TenantRegistry, Problem> {
        self.tenants.as_deref().ok_or_else(|| {
            Problem::unavailable(
                "this onramp has no tenant registry: set ONRAMP_TENANTS (with ONRAMP_AUTHENTIK_URL and \
                 ONRAMP_AUTHENTIK_TOKEN, which the reconcile flows need)",
            )
        })
    }
}

/// One served route.
pub struct Route {
    pub method: Method,
    pub path: &'static str,
    handler: MethodRouter<Shared>,
    /// Its response stays open (a live stream): no request timeout.
    long_lived: bool,
    /// The handler limits its body itself (with its own setting).
    own_body_limit: bool,
}

impl Route {
    pub(crate) fn long_lived(mut self) -> Self {
        self.long_lived = true;
        self
    }

    pub(crate) fn own_body_limit(mut self) -> Self {
        self.own_body_limit = true;
        self
    }
}

pub(crate) fn route<H, T>(method: Method, path: &'static str, handler: H) -> Route
where
    H: axum::handler::Handler<T, Shared>,
    T: 'static,
{
    let filter = MethodFilter::try_from(method.clone()).expect("a standard method");
    Route { method, path, handler: on(filter, handler), long_lived: false, own_body_limit: false }
}

/// Every route onramp serves.
pub fn routes() -> Vec<Route> {
    let areas = [
        health::routes(),
        metrics::routes(),
        jobs::routes(),
        work::routes(),
        tenants::routes(),
        users::routes(),
        plans::routes(),
        tokens::routes(),
        callbacks::routes(),
        webhook::routes(),
        deliveries::routes(),
        dashboard::routes(),
    ];
    areas.into_iter().flatten().collect()
}

pub fn router(state: AppState) -> Router {
    build(routes(), state)
}

/// The routes of a worker process's own small listener: health and metrics.
pub fn ops_routes() -> Vec<Route> {
    [health::routes(), metrics::routes()].into_iter().flatten().collect()
}

fn build(routes: Vec<Route>, state: AppState) -> Router {
    let settings = state.http.clone();
    let mut r = Router::new();
    for route in routes {
        r = r.route(route.path, layers::per_route(route, &settings));
    }
    let r = r
        .fallback(|| async { Problem::not_found("no such route (openapi.yaml lists every route)") })
        .method_not_allowed_fallback(|method: Method| async move {
            Problem::new(
                axum::http::StatusCode::METHOD_NOT_ALLOWED,
                "method-not-allowed",
                "Method not allowed",
                format!("this route does not take {method}; the Allow header lists the methods it takes"),
            )
        })
        .with_state(Arc::new(state));
    layers::around(r, &settings)
}

/// Serves until `shutdown` is cancelled, then finishes the requests in flight (live streams end).
pub async fn serve(listener: TcpListener, mut state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    state.shutdown = shutdown.clone();
    let settings = state.http.clone();
    server::run(listener, router(state), settings, shutdown).await
}

/// Serves only `/metrics`, `/healthz` and `/readyz` (a worker process without the API).
pub async fn serve_ops(listener: TcpListener, mut state: AppState, shutdown: CancellationToken) -> std::io::Result<()> {
    state.shutdown = shutdown.clone();
    let settings = state.http.clone();
    server::run(listener, build(ops_routes(), state), settings, shutdown).await
}

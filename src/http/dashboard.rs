//! The job-status dashboard: a static page, script and stylesheet compiled into the binary (no
//! CDN, no build step). They hold no data: everything they show comes from /v1 with the operator's
//! bearer token, which the page keeps in the tab's sessionStorage.

use axum::http::{Method, header};
use axum::response::{IntoResponse, Redirect};

use super::{Route, route};

const INDEX: &str = include_str!("assets/index.html");
const SCRIPT: &str = include_str!("assets/app.js");
const VIEWS: &str = include_str!("assets/views.js");
const STYLE: &str = include_str!("assets/app.css");

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/", || async { Redirect::to("/dashboard") }),
        route(Method::GET, "/dashboard", || async { asset("text/html; charset=utf-8", INDEX) }),
        route(Method::GET, "/dashboard/app.js", || async { asset("text/javascript; charset=utf-8", SCRIPT) }),
        route(Method::GET, "/dashboard/views.js", || async { asset("text/javascript; charset=utf-8", VIEWS) }),
        route(Method::GET, "/dashboard/app.css", || async { asset("text/css; charset=utf-8", STYLE) }),
    ]
}

fn asset(content_type: &'static str, body: &'static str) -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CONTENT_SECURITY_POLICY, "default-src 'self'; frame-ancestors 'none'"),
        ],
        body,
    )
}

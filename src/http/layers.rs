//! What wraps the routes: a request id (`x-request-id`, kept when the caller sent one, echoed in
//! the response), a span per request, CORS for the portal when origins are configured, a 400 for
//! control characters (NUL, …) in the path or query; and per
//! route a timeout (not for the live stream) and a body limit (not for the webhook, which has
//! its own). What the layers refuse is answered as problem+json like every other error.

use std::convert::Infallible;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;
use tracing::Span;
use tracing::field::Empty;

use super::source::IpNet;
use super::{Problem, Route, Shared, idempotency};

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The HTTP server's own settings.
#[derive(Clone, Debug)]
pub struct HttpSettings {
    /// Longest a request may take (the live job stream is exempt).
    pub timeout: Duration,
    /// Largest request body of the API (the webhook has its own limit).
    pub max_body: usize,
    /// Browser origins allowed to call the API; empty: no CORS headers at all.
    pub cors_origins: Vec<HeaderValue>,
    /// Longest a client may take to send a request's head, from connecting (or from the first
    /// byte of a later request on the connection).
    pub header_timeout: Duration,
    /// Longest pause while a request body is read (then 408 and the connection is closed).
    pub body_timeout: Duration,
    /// A connection with no request for this long is closed.
    pub idle_timeout: Duration,
    /// Most connections served at once; one more waits a moment for a free slot, then is closed.
    pub max_connections: usize,
    /// Most live job streams one token may have open at once (then 429).
    pub streams_per_token: usize,
    /// A live job stream ends after this long; clients reconnect.
    pub stream_lifetime: Duration,
    /// Proxies whose `X-Forwarded-For` names the client (for the login limiter); empty: the
    /// peer address is the client.
    pub trusted_proxies: Vec<IpNet>,
}

impl Default for HttpSettings {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(30),
            max_body: 1 << 20,
            cors_origins: vec![],
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            max_connections: 1024,
            streams_per_token: 4,
            stream_lifetime: Duration::from_secs(15 * 60),
            trusted_proxies: vec![],
        }
    }
}

/// A browser origin, `scheme://host[:port]` as browsers send it (no path, no trailing slash).
pub fn parse_origin(s: &str) -> Result<HeaderValue, String> {
    let bad = || format!("{s:?} is not an origin like https://portal.example.org");
    let uri: Uri = s.parse().map_err(|_| bad())?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    if !scheme_ok || uri.host().is_none() || s.ends_with('/') || uri.path() != "/" || uri.query().is_some() {
        return Err(bad());
    }
    HeaderValue::from_str(&s.to_ascii_lowercase()).map_err(|_| bad())
}

/// A route with its own timeout and body limit, as it declares them.
pub(super) fn per_route(route: Route, s: &HttpSettings) -> MethodRouter<Shared> {
    let mut h = route.handler;
    if !route.own_body_limit {
        h = h.layer::<_, Infallible>(RequestBodyLimitLayer::new(s.max_body));
        h = h.layer::<_, Infallible>(DefaultBodyLimit::disable());
    }
    if !route.long_lived {
        h = h.layer::<_, Infallible>(TimeoutLayer::with_status_code(StatusCode::SERVICE_UNAVAILABLE, s.timeout));
    }
    h.layer::<_, Infallible>(axum::middleware::map_response(as_problem))
}

/// Request id, request span, CORS and the check of the URI around every route (the outermost
/// runs first).
pub(super) fn around(router: Router, s: &HttpSettings) -> Router {
    let router = router.layer(axum::middleware::from_fn(refuse_control_characters));
    let router = match cors(&s.cors_origins) {
        Some(c) => router.layer(c),
        None => router,
    };
    let trace = TraceLayer::new_for_http()
        .make_span_with(request_span)
        .on_request(())
        .on_response(|res: &Response, latency: Duration, span: &Span| {
            span.record("http.response.status_code", res.status().as_u16());
            if res.status().is_server_error() {
                span.record("otel.status_code", "ERROR");
            }
            tracing::debug!(parent: span, status = res.status().as_u16(), ms = latency.as_millis() as u64, "request");
        })
        .on_failure(());
    router
        .layer(PropagateRequestIdLayer::new(REQUEST_ID))
        .layer(trace)
        .layer(SetRequestIdLayer::new(REQUEST_ID, MakeRequestUuid))
}

/// The span of one request: the route's template (never the path with its values, nor the query).
fn request_span(req: &Request) -> Span {
    let route = req.extensions().get::<MatchedPath>().map_or("unmatched", MatchedPath::as_str);
    let id = req.headers().get(&REQUEST_ID).and_then(|v| v.to_str().ok()).unwrap_or("");
    tracing::info_span!(
        "request",
        otel.name = %format_args!("{} {route}", req.method()),
        otel.kind = "server",
        otel.status_code = Empty,
        http.request.method = %req.method(),
        http.route = route,
        request_id = id,
        http.response.status_code = Empty,
    )
}

fn cors(origins: &[HeaderValue]) -> Option<CorsLayer> {
    if origins.is_empty() {
        return None;
    }
    let headers =
        [header::AUTHORIZATION, header::CONTENT_TYPE, HeaderName::from_static(idempotency::HEADER), REQUEST_ID];
    Some(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins.iter().cloned()))
            .allow_methods([Method::GET, Method::POST])
            .allow_headers(headers)
            .expose_headers([REQUEST_ID])
            .max_age(Duration::from_secs(600)),
    )
}

/// No name, filter or cursor has a control character, and PostgreSQL cannot store NUL: a path
/// or query with one (raw or percent-encoded, e.g. `%00`) is refused before any handler.
async fn refuse_control_characters(req: Request, next: Next) -> Response {
    let uri = req.uri();
    let part = if has_control_character(uri.path()) {
        Some("path")
    } else if uri.query().is_some_and(has_control_character) {
        Some("query")
    } else {
        None
    };
    match part {
        Some(part) => Problem::bad_request(format!(
            "the request's {part} contains a control character (such as NUL, %00), which no name, filter or cursor has"
        ))
        .into_response(),
        None => next.run(req).await,
    }
}

/// A C0 control character or DEL in `s`, raw or percent-encoded.
fn has_control_character(s: &str) -> bool {
    let b = s.as_bytes();
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut i = 0;
    while i < b.len() {
        let (byte, width) = match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(hi), Some(lo)) => (hi << 4 | lo, 3),
            (c, _, _) => (c, 1),
        };
        if byte < 0x20 || byte == 0x7f {
            return true;
        }
        i += width;
    }
    false
}

/// The answers the layers make themselves (a body too large, a request too slow) as problems.
async fn as_problem(res: Response) -> Response {
    let plain = res.headers().get(header::CONTENT_TYPE).is_none_or(|v| v.as_bytes().starts_with(b"text/plain"));
    match res.status() {
        StatusCode::PAYLOAD_TOO_LARGE if plain => {
            Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "too-large", "Body too large", "the request body is too large")
                .into_response()
        }
        StatusCode::SERVICE_UNAVAILABLE if res.headers().get(header::CONTENT_TYPE).is_none() => {
            Problem::new(StatusCode::SERVICE_UNAVAILABLE, "timeout", "Timeout", "the request took too long; retry")
                .into_response()
        }
        _ => res,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_scheme_host_and_port_only() {
        assert_eq!(parse_origin("https://Portal.example.org").unwrap(), "https://portal.example.org");
        assert_eq!(parse_origin("http://localhost:5173").unwrap(), "http://localhost:5173");
        for bad in
            ["portal.example.org", "https://portal.example.org/", "https://p.example/app", "ftp://p.example", "*"]
        {
            assert!(parse_origin(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn control_characters_are_found_raw_and_percent_encoded() {
        for bad in ["tenant=%00", "a%1Fb", "x=%7f", "%0A", "user=al%00ice&x=1", "\u{1}"] {
            assert!(has_control_character(bad), "{bad}");
        }
        for good in ["tenant=foo&user=alice", "/v1/jobs/42", "a%20b", "%", "%0", "%zz", "q=%C3%A9", "x=100%25"] {
            assert!(!has_control_character(good), "{good}");
        }
    }
}

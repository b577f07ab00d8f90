//! Errors as `application/problem+json` (RFC 9457) with a stable `type`. Internal causes are
//! logged, never sent.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::engine::EngineError;

#[derive(Debug, Serialize)]
pub struct Problem {
    #[serde(rename = "type")]
    pub kind: String,
    pub title: &'static str,
    pub status: u16,
    pub detail: String,
    /// Sent as a Retry-After header.
    #[serde(skip)]
    pub retry_after: Option<u64>,
}

impl Problem {
    pub fn new(status: StatusCode, kind: &str, title: &'static str, detail: impl Into<String>) -> Self {
        Self {
            kind: format!("urn:onramp:problem:{kind}"),
            title,
            status: status.as_u16(),
            detail: detail.into(),
            retry_after: None,
        }
    }
    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not-found", "Not found", detail)
    }
    pub fn unauthorized() -> Self {
        Self::new(StatusCode::UNAUTHORIZED, "unauthorized", "Unauthorized", "a valid bearer token is required")
    }
    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad-request", "Bad request", detail)
    }
    /// Well-formed but not acceptable: an unknown field, a bad name, a tenant not in the registry.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "invalid-request", "Invalid request", detail)
    }
    pub fn forbidden(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "forbidden", "Forbidden", detail)
    }
    /// A part of onramp this request needs is not configured; `detail` names the setting.
    pub fn unavailable(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "not-configured", "Not configured", detail)
    }
    pub fn internal() -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", "Internal error", "see the service's log")
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let retry_after = self.retry_after;
        let mut res = (status, Json(self)).into_response();
        let headers = res.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/problem+json"));
        if let Some(secs) = retry_after {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        res
    }
}

impl From<EngineError> for Problem {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::NotFound(id) => Problem::not_found(format!("job {id} not found")),
            e @ EngineError::InvalidState { .. } => {
                Problem::new(StatusCode::CONFLICT, "invalid-state", "Not possible in the job's state", e.to_string())
            }
            e @ EngineError::UnknownKind(_) => Problem::bad_request(e.to_string()),
            e @ EngineError::FourEyes { .. } => {
                Problem::new(StatusCode::FORBIDDEN, "four-eyes", "Needs a second person", e.to_string())
            }
            e => {
                tracing::error!(error = %e, "request failed");
                Problem::internal()
            }
        }
    }
}

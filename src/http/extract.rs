//! Extractors whose rejections are problem+json like every other error: a JSON body (required or
//! optional), query parameters and path parameters. A body that is valid JSON but not the expected
//! shape (an unknown field, a missing one, a wrong type) is 422, and so is a NUL character in any
//! of its strings (PostgreSQL stores none); malformed JSON is 400.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::Problem;

/// A required JSON body.
pub struct Body<T>(pub T);

/// A JSON body that may be left out (no body, or an empty one, is `T::default()`).
pub struct OptBody<T>(pub T);

/// Query parameters.
pub struct Params<T>(pub T);

/// Path parameters.
pub struct PathParam<T>(pub T);

fn json_rejection(e: JsonRejection) -> Problem {
    match e {
        JsonRejection::JsonDataError(e) => Problem::unprocessable(e.body_text()),
        JsonRejection::JsonSyntaxError(e) => Problem::bad_request(e.body_text()),
        JsonRejection::MissingJsonContentType(e) => unsupported(e.body_text()),
        e if e.status() == StatusCode::PAYLOAD_TOO_LARGE => {
            Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "too-large", "Body too large", e.body_text())
        }
        e => Problem::bad_request(e.body_text()),
    }
}

fn unsupported(detail: String) -> Problem {
    Problem::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type", "Unsupported media type", detail)
}

/// Whether the request says its body is JSON (`None`: it says nothing).
fn json_type(req: &Request) -> Option<bool> {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
        .map(|m| m == "application/json" || m.ends_with("+json"))
}

async fn bytes<S: Send + Sync>(req: Request, state: &S) -> Result<Bytes, Problem> {
    Bytes::from_request(req, state).await.map_err(|e| match e.status() {
        StatusCode::PAYLOAD_TOO_LARGE => {
            Problem::new(StatusCode::PAYLOAD_TOO_LARGE, "too-large", "Body too large", e.body_text())
        }
        _ => Problem::bad_request(e.body_text()),
    })
}

/// PostgreSQL stores no NUL character (in text or in jsonb), and no field of the API has one:
/// a body with a `\u0000` in a string is refused, naming where.
fn refuse_nul(bytes: &[u8]) -> Result<(), Problem> {
    if !bytes.windows(6).any(|w| w == b"\\u0000") {
        return Ok(());
    }
    // the escape may be text (an escaped backslash before "u0000"): decide on the parsed value
    let Ok(value) = serde_json::from_slice::<Value>(bytes) else { return Ok(()) };
    match nul_at(&value, "") {
        Some(at) => Err(Problem::unprocessable(format!(
            "{at} contains a NUL character (\\u0000), which no field accepts",
            at = if at.is_empty() { "the body".to_string() } else { format!("field {at}") }
        ))),
        None => Ok(()),
    }
}

/// Where in `v` a string (or a key) has a NUL: a JSON pointer.
fn nul_at(v: &Value, at: &str) -> Option<String> {
    match v {
        Value::String(s) => s.contains('\0').then(|| at.to_string()),
        Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| nul_at(v, &format!("{at}/{i}"))),
        Value::Object(map) => map.iter().find_map(|(k, v)| {
            let here = format!("{at}/{}", k.replace('\0', "\\u0000"));
            if k.contains('\0') { Some(here) } else { nul_at(v, &here) }
        }),
        _ => None,
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        if json_type(&req) != Some(true) {
            return Err(unsupported("Expected request with `Content-Type: application/json`".into()));
        }
        let bytes = bytes(req, state).await?;
        refuse_nul(&bytes)?;
        Json::<T>::from_bytes(&bytes).map(|Json(v)| Body(v)).map_err(json_rejection)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let json_type = json_type(&req);
        let bytes = bytes(req, state).await?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptBody(T::default()));
        }
        if json_type == Some(false) {
            return Err(unsupported("Expected request with `Content-Type: application/json`".into()));
        }
        refuse_nul(&bytes)?;
        Json::<T>::from_bytes(&bytes).map(|Json(v)| OptBody(v)).map_err(json_rejection)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|e| super::params::query_problem(&e.body_text()))
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParam<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Path::<T>::from_request_parts(parts, state).await.map(|Path(v)| PathParam(v)).map_err(|e| {
            Problem::bad_request(format!(
                "the path cannot be read: {}",
                e.body_text().trim_start_matches("Invalid URL: ")
            ))
        })
    }
}

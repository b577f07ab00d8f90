//! Extractors whose rejections are problem+json like every other error: a JSON body (required or
//! optional), query parameters and path parameters. A body that is valid JSON but not the expected
//! shape (an unknown field, a missing one, a wrong type) is 422; malformed JSON is 400.

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use serde::de::DeserializeOwned;

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

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Body<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        Json::<T>::from_request(req, state).await.map(|Json(v)| Body(v)).map_err(json_rejection)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Default> FromRequest<S> for OptBody<T> {
    type Rejection = Problem;

    async fn from_request(req: Request, state: &S) -> Result<Self, Problem> {
        let json_type = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
            .map(|m| m == "application/json" || m.ends_with("+json"));
        let bytes = Bytes::from_request(req, state).await.map_err(|e| Problem::bad_request(e.body_text()))?;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return Ok(OptBody(T::default()));
        }
        if json_type == Some(false) {
            return Err(unsupported("Expected request with `Content-Type: application/json`".into()));
        }
        Json::<T>::from_bytes(&bytes).map(|Json(v)| OptBody(v)).map_err(json_rejection)
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for Params<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Query::<T>::from_request_parts(parts, state)
            .await
            .map(|Query(v)| Params(v))
            .map_err(|e| Problem::bad_request(e.body_text()))
    }
}

impl<S: Send + Sync, T: DeserializeOwned + Send> FromRequestParts<S> for PathParam<T> {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Problem> {
        Path::<T>::from_request_parts(parts, state)
            .await
            .map(|Path(v)| PathParam(v))
            .map_err(|e| Problem::bad_request(e.body_text()))
    }
}

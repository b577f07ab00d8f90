//! The fake API server's control API, for a test in another process (JSON under `/_fake/`):
//!
//! | request | does |
//! |---|---|
//! | `GET /_fake/objects?prefix=P` | the objects whose URL starts with P: `{url: object}` |
//! | `GET /_fake/object?url=U` | one object (404 when absent) |
//! | `PUT /_fake/object?url=U` | stores the body as the object at U |
//! | `DELETE /_fake/object?url=U` | removes it |
//! | `POST /_fake/pods` | `{namespace, name, labels, ready}`: a Running pod |
//! | `POST /_fake/deployments` | `{namespace, name, labels}` |
//! | `POST /_fake/projections` | `{namespace, secret, dir}`: project the Secret into dir, as kubelet |
//! | `POST /_fake/operator` | `{stuck, gc_delay_ms}`: how a deleted object's dependents are collected |
//! | `POST /_fake/faults` | `{method, path, status?, retry_after?, delay_ms?, drop_exec?}`: the next matching request fails so |
//! | `POST /_fake/chaos` | `{rate, seed?, kinds, paths?, retry_after?, delay_ms?}`: from now on each API request (whose path with query contains one of `paths`, if given) fails with probability `rate`, of a kind drawn from `kinds`: `"5xx"`, `"429"` (with `Retry-After`), `"timeout"` (answers `delay_ms` late), `"drop_exec"` (exec only) |
//! | `GET /_fake/chaos` | `{spec, matched, injected: {kind: count}, events: [{at_ms, method, path, kind, status?}]}` |
//! | `DELETE /_fake/chaos` | no more chaos (the counts start again) |
//! | `POST /_fake/forbid` | `{verb, resource, namespace?}`: RBAC refuses it from now on (403 naming the permission) |
//! | `DELETE /_fake/namespaces/{ns}` | deletes the namespace and its objects; creating in it answers 404 `namespaces "ns" not found` |
//! | `GET /_fake/requests` | every API request: `[{method, path, verb, resource, namespace}]` |
//! | `GET /_fake/execs` | every exec that ended: `[{namespace, pod, argv, code}]` |
//! | `GET /_fake/patches` | every PATCH: `[{content_type, path, body}]` |

use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Access, FakeK8s, Fault, Projection, Shared};
use crate::chaos::{ChaosReport, ChaosSpec};

pub(super) fn router() -> Router<Shared> {
    Router::new()
        .route("/objects", get(objects))
        .route("/object", get(object).put(put_object).delete(delete_object))
        .route("/pods", post(pods))
        .route("/deployments", post(deployments))
        .route("/projections", post(projections))
        .route("/operator", post(operator))
        .route("/faults", post(faults))
        .route("/chaos", get(chaos_report).post(chaos).delete(no_chaos))
        .route("/forbid", post(forbid))
        .route("/namespaces/{ns}", axum::routing::delete(delete_namespace))
        .route("/requests", get(requests))
        .route("/execs", get(execs))
        .route("/patches", get(patches))
}

fn fake(inner: Shared) -> FakeK8s {
    FakeK8s { inner, url: String::new() }
}

#[derive(Deserialize)]
struct At {
    #[serde(default)]
    url: String,
    #[serde(default)]
    prefix: String,
}

async fn objects(State(s): State<Shared>, Query(q): Query<At>) -> Json<Value> {
    Json(json!(fake(s).objects(&q.prefix)))
}

async fn object(State(s): State<Shared>, Query(q): Query<At>) -> Response {
    match fake(s).get(&q.url) {
        Some(o) => Json(o).into_response(),
        None => (StatusCode::NOT_FOUND, Json(json!({"error": format!("no object at {}", q.url)}))).into_response(),
    }
}

async fn put_object(State(s): State<Shared>, Query(q): Query<At>, Json(obj): Json<Value>) -> StatusCode {
    fake(s).put(&q.url, obj);
    StatusCode::NO_CONTENT
}

async fn delete_object(State(s): State<Shared>, Query(q): Query<At>) -> StatusCode {
    match s.lock().unwrap().store(&q.url, None) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

/// A pod or a Deployment to create.
#[derive(Debug, Deserialize, Serialize)]
pub struct Workload {
    pub namespace: String,
    pub name: String,
    #[serde(default)]
    pub labels: Value,
    #[serde(default = "yes")]
    pub ready: bool,
}

fn yes() -> bool {
    true
}

async fn pods(State(s): State<Shared>, Json(w): Json<Workload>) -> StatusCode {
    fake(s).pod(&w.namespace, &w.name, w.labels, w.ready);
    StatusCode::NO_CONTENT
}

async fn deployments(State(s): State<Shared>, Json(w): Json<Workload>) -> StatusCode {
    fake(s).deployment(&w.namespace, &w.name, w.labels);
    StatusCode::NO_CONTENT
}

async fn projections(State(s): State<Shared>, Json(p): Json<Projection>) -> StatusCode {
    fake(s).project(p);
    StatusCode::NO_CONTENT
}

async fn operator(State(s): State<Shared>, Json(op): Json<super::operator::Operator>) -> StatusCode {
    fake(s).operator(op);
    StatusCode::NO_CONTENT
}

/// An injected fault, as the control API takes it.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct FaultSpec {
    /// `GET`, `PATCH`, … (exec is a `GET`).
    pub method: String,
    /// A part of the request's path (with its query for exec, e.g. `command=mv`).
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delay_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drop_exec: bool,
}

impl FaultSpec {
    pub fn fault(&self) -> Result<(Method, Fault), String> {
        let method = Method::from_bytes(self.method.to_uppercase().as_bytes()).map_err(|e| e.to_string())?;
        let fault = match (self.status, self.delay_ms, self.drop_exec) {
            (Some(code), None, false) if (400..600).contains(&code) => Fault::Status(code, self.retry_after),
            (None, Some(ms), false) => Fault::Delay(Duration::from_millis(ms)),
            (None, None, true) => Fault::DropExec,
            _ => return Err("give one of status (400-599), delay_ms, drop_exec".into()),
        };
        Ok((method, fault))
    }
}

async fn faults(State(s): State<Shared>, Json(f): Json<FaultSpec>) -> Response {
    match f.fault() {
        Ok((method, fault)) => {
            fake(s).fault(method, &f.path, fault);
            StatusCode::NO_CONTENT.into_response()
        }
        Err(e) => (StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"error": e}))).into_response(),
    }
}

/// One API request, as the control API lists them.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Request {
    pub method: String,
    pub path: String,
    #[serde(flatten)]
    pub access: Access,
}

async fn requests(State(s): State<Shared>) -> Json<Vec<Request>> {
    let g = s.lock().unwrap();
    Json(g.log.iter().map(|(m, p, a)| Request { method: m.to_string(), path: p.clone(), access: a.clone() }).collect())
}

async fn execs(State(s): State<Shared>) -> Json<Value> {
    Json(json!(fake(s).execs()))
}

async fn patches(State(s): State<Shared>) -> Json<Value> {
    let p: Vec<Value> = fake(s)
        .patches()
        .into_iter()
        .map(|(ct, path, body)| json!({"content_type": ct, "path": path, "body": body}))
        .collect();
    Json(json!(p))
}

async fn chaos(State(s): State<Shared>, Json(spec): Json<ChaosSpec>) -> Response {
    if let Err(e) = spec.check() {
        return (StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"error": e}))).into_response();
    }
    fake(s).chaos(Some(spec));
    StatusCode::NO_CONTENT.into_response()
}

async fn chaos_report(State(s): State<Shared>) -> Json<ChaosReport> {
    Json(fake(s).chaos_report())
}

async fn no_chaos(State(s): State<Shared>) -> StatusCode {
    fake(s).chaos(None);
    StatusCode::NO_CONTENT
}

async fn forbid(State(s): State<Shared>, Json(a): Json<Access>) -> StatusCode {
    fake(s).forbid(a);
    StatusCode::NO_CONTENT
}

async fn delete_namespace(State(s): State<Shared>, Path(ns): Path<String>) -> StatusCode {
    fake(s).delete_namespace(&ns);
    StatusCode::NO_CONTENT
}

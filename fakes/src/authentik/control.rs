//! The fake Authentik's control API, for a test in another process (JSON under `/_fake/`):
//!
//! | request | does |
//! |---|---|
//! | `GET /_fake/users` | the users: `[{pk, username, is_active, groups, attributes, email?}]` |
//! | `POST /_fake/users` | adds or replaces the users in the body (a list, same shape) |
//! | `DELETE /_fake/users/{pk}` | removes a user |
//! | `GET /_fake/groups` / `POST /_fake/groups` | the group names / adds the names in the body |
//! | `DELETE /_fake/groups/{name}` | removes a group (members keep the name, as a stale membership) |
//! | `POST /_fake/faults` | `[{status, retry_after?}]`: the next API requests get these answers first |
//! | `DELETE /_fake/faults` | drops the answers not given yet (an outage that ends) |
//! | `POST /_fake/chaos` | `{rate, seed?, kinds, paths?, retry_after?, delay_ms?}`: from now on each API request (whose path with query contains one of `paths`, if given) fails with probability `rate`, of a kind drawn from `kinds`: `"5xx"`, `"429"` (with `Retry-After`), `"timeout"` (answers `delay_ms` late) |
//! | `GET /_fake/chaos` | `{spec, matched, injected: {kind: count}, events: [{at_ms, method, path, kind, status?}]}` |
//! | `DELETE /_fake/chaos` | no more chaos (the counts start again) |
//! | `GET /_fake/requests` | every API request it saw, one line each (not those the chaos failed) |

use std::collections::BTreeMap;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use super::{Fake, FakeUser};
use crate::chaos::{ChaosReport, ChaosSpec};

pub(super) fn router() -> Router<Fake> {
    Router::new()
        .route("/users", get(users).post(add_users))
        .route("/users/{pk}", delete(delete_user))
        .route("/groups", get(groups).post(add_groups))
        .route("/groups/{name}", delete(delete_group))
        .route("/faults", axum::routing::post(faults).delete(clear_faults))
        .route("/requests", get(requests))
        .route("/chaos", get(chaos_report).post(chaos).delete(no_chaos))
}

async fn users(State(f): State<Fake>) -> Json<Vec<FakeUser>> {
    Json(f.lock().unwrap().users.values().cloned().collect())
}

async fn add_users(State(f): State<Fake>, Json(list): Json<Vec<FakeUser>>) -> StatusCode {
    let mut st = f.lock().unwrap();
    let new: BTreeMap<i64, FakeUser> = list.into_iter().map(|u| (u.pk, u)).collect();
    st.users.extend(new);
    StatusCode::NO_CONTENT
}

async fn delete_user(State(f): State<Fake>, Path(pk): Path<i64>) -> StatusCode {
    match f.lock().unwrap().users.remove(&pk) {
        Some(_) => StatusCode::NO_CONTENT,
        None => StatusCode::NOT_FOUND,
    }
}

async fn groups(State(f): State<Fake>) -> Json<Vec<String>> {
    Json(f.lock().unwrap().groups.clone())
}

async fn add_groups(State(f): State<Fake>, Json(names): Json<Vec<String>>) -> StatusCode {
    let mut st = f.lock().unwrap();
    for n in names {
        if !st.groups.contains(&n) {
            st.groups.push(n);
        }
    }
    StatusCode::NO_CONTENT
}

async fn delete_group(State(f): State<Fake>, Path(name): Path<String>) -> StatusCode {
    let mut st = f.lock().unwrap();
    let before = st.groups.len();
    st.groups.retain(|g| *g != name);
    if st.groups.len() < before { StatusCode::NO_CONTENT } else { StatusCode::NOT_FOUND }
}

/// An answer to give before the real one.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct FailNext {
    pub status: u16,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
}

async fn faults(State(f): State<Fake>, Json(list): Json<Vec<FailNext>>) -> StatusCode {
    if list.iter().any(|x| !(400..600).contains(&x.status)) {
        return StatusCode::UNPROCESSABLE_ENTITY;
    }
    f.lock().unwrap().fail_next.extend(list.into_iter().map(|x| (x.status, x.retry_after)));
    StatusCode::NO_CONTENT
}

async fn clear_faults(State(f): State<Fake>) -> StatusCode {
    f.lock().unwrap().fail_next.clear();
    StatusCode::NO_CONTENT
}

async fn requests(State(f): State<Fake>) -> Json<Vec<String>> {
    Json(f.lock().unwrap().requests.clone())
}

async fn chaos(State(f): State<Fake>, Json(spec): Json<ChaosSpec>) -> (StatusCode, String) {
    if let Err(e) = spec.check() {
        return (StatusCode::UNPROCESSABLE_ENTITY, e);
    }
    f.lock().unwrap().chaos.set(Some(spec));
    (StatusCode::NO_CONTENT, String::new())
}

async fn chaos_report(State(f): State<Fake>) -> Json<ChaosReport> {
    Json(f.lock().unwrap().chaos.report())
}

async fn no_chaos(State(f): State<Fake>) -> StatusCode {
    f.lock().unwrap().chaos.set(None);
    StatusCode::NO_CONTENT
}

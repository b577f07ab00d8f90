//! A fake Authentik API speaking its wire format (`/api/v3/core/users/`, `/users/{pk}/` with
//! PATCH, `/groups/`, paginated as Authentik paginates, Bearer token checked), with injected
//! failures (status and Retry-After; one-shot, or at a rate: [`crate::chaos`]) and a log of the
//! requests it saw. A test in another process
//! drives it through `/_fake/…` (see [`control`]).

pub mod control;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::chaos::Decision;

/// The API token of the in-process fake ([`fake_authentik`]).
pub const TOKEN: &str = "ak-test-token";

/// A user as the fake keeps it (and as the control API takes and gives it).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct FakeUser {
    pub pk: i64,
    pub username: String,
    #[serde(default = "yes")]
    pub is_active: bool,
    /// Group names.
    #[serde(default)]
    pub groups: Vec<String>,
    /// e.g. `{"sshPublicKey": "ssh-ed25519 …"}`.
    #[serde(default = "empty")]
    pub attributes: Value,
    /// The address Authentik has; `<username>@example.org` when not given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
}

fn yes() -> bool {
    true
}

fn empty() -> Value {
    json!({})
}

/// Authentik's state and a log of the requests it saw.
#[derive(Default)]
pub struct FakeState {
    pub users: BTreeMap<i64, FakeUser>,
    pub groups: Vec<String>,
    /// Answers to give before the real one: (status, Retry-After seconds).
    pub fail_next: VecDeque<(u16, Option<u64>)>,
    pub requests: Vec<String>,
    /// The API token it accepts (`Authorization: Bearer <token>`).
    pub token: String,
    /// Rate-based faults (see [`crate::chaos`]).
    pub chaos: crate::chaos::Chaos,
}

/// The `pk` Authentik gives a group (a UUID), derived from its name.
pub fn group_uuid(name: &str) -> String {
    format!("{:032x}", name.bytes().fold(0u128, |h, b| h.wrapping_mul(131).wrapping_add(b as u128)))
}

impl FakeUser {
    pub fn new(pk: i64, username: &str, groups: &[&str]) -> Self {
        Self {
            pk,
            username: username.into(),
            is_active: true,
            groups: groups.iter().map(|g| g.to_string()).collect(),
            attributes: json!({}),
            email: None,
        }
    }
    fn json(&self) -> Value {
        json!({
            "pk": self.pk, "username": self.username, "name": format!("{} Example", self.username),
            "email": self.email.clone().unwrap_or_else(|| format!("{}@example.org", self.username)), "is_active": self.is_active,
            "last_login": null, "is_superuser": false,
            "groups": self.groups.iter().map(|g| group_uuid(g)).collect::<Vec<_>>(),
            "groups_obj": self.groups.iter().map(|g| json!({"pk": group_uuid(g), "num_pk": 1, "name": g,
                "is_superuser": false, "parent": null, "parent_name": null, "attributes": {}})).collect::<Vec<_>>(),
            "attributes": self.attributes, "uid": format!("uid-{}", self.pk),
            "uuid": format!("00000000-0000-4000-8000-{:012}", self.pk), "path": "users", "type": "internal",
        })
    }
}

pub type Fake = Arc<Mutex<FakeState>>;

/// One page of `items` as Authentik answers it (`page` from 1, `page_size` default 20), only
/// that page's items rendered by `render`.
fn page<T>(items: Vec<T>, q: &BTreeMap<String, String>, render: impl Fn(T) -> Value) -> Value {
    let size: usize = q.get("page_size").and_then(|s| s.parse().ok()).filter(|&n| n > 0).unwrap_or(20);
    let pageno: usize = q.get("page").and_then(|s| s.parse().ok()).filter(|&n| n > 0).unwrap_or(1);
    let total = items.len();
    let pages = total.div_ceil(size).max(1);
    let results: Vec<Value> = items.into_iter().skip((pageno - 1) * size).take(size).map(render).collect();
    json!({
        "pagination": { "next": if pageno < pages { pageno + 1 } else { 0 }, "previous": pageno.saturating_sub(1),
                        "count": total, "current": pageno, "total_pages": pages,
                        "start_index": (pageno - 1) * size + 1, "end_index": ((pageno - 1) * size + size).min(total) },
        "results": results,
        "autocomplete": {},
    })
}

fn gate(st: &mut FakeState, h: &HeaderMap, what: String) -> Option<Response> {
    st.requests.push(what);
    if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {}", st.token)) {
        return Some((StatusCode::FORBIDDEN, Json(json!({"detail": "Token invalid/expired"}))).into_response());
    }
    if let Some((status, retry)) = st.fail_next.pop_front() {
        let mut r = (StatusCode::from_u16(status).unwrap(), "overloaded").into_response();
        if let Some(s) = retry {
            r.headers_mut().insert("retry-after", s.to_string().parse().unwrap());
        }
        return Some(r);
    }
    None
}

async fn users(State(f): State<Fake>, h: HeaderMap, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let mut st = f.lock().unwrap();
    if let Some(r) = gate(&mut st, &h, format!("GET users {q:?}")) {
        return r;
    }
    let list: Vec<&FakeUser> = st
        .users
        .values()
        .filter(|u| q.get("username").is_none_or(|n| &u.username == n))
        .filter(|u| q.get("groups_by_name").is_none_or(|g| u.groups.contains(g)))
        .filter(|u| q.get("is_active").is_none_or(|a| (a == "true") == u.is_active))
        .collect();
    Json(page(list, &q, FakeUser::json)).into_response()
}

async fn user(State(f): State<Fake>, h: HeaderMap, Path(pk): Path<i64>) -> Response {
    let mut st = f.lock().unwrap();
    if let Some(r) = gate(&mut st, &h, format!("GET user {pk}")) {
        return r;
    }
    match st.users.get(&pk) {
        Some(u) => Json(u.json()).into_response(),
        None => (StatusCode::NOT_FOUND, Json(json!({"detail": "No User matches the given query."}))).into_response(),
    }
}

async fn patch_user(State(f): State<Fake>, h: HeaderMap, Path(pk): Path<i64>, Json(b): Json<Value>) -> Response {
    let mut st = f.lock().unwrap();
    if let Some(r) = gate(&mut st, &h, format!("PATCH user {pk} {b}")) {
        return r;
    }
    match st.users.get_mut(&pk) {
        Some(u) => {
            if let Some(a) = b.get("is_active").and_then(Value::as_bool) {
                u.is_active = a;
            }
            Json(u.json()).into_response()
        }
        None => (StatusCode::NOT_FOUND, Json(json!({"detail": "No User matches the given query."}))).into_response(),
    }
}

async fn groups(State(f): State<Fake>, h: HeaderMap, Query(q): Query<BTreeMap<String, String>>) -> Response {
    let mut st = f.lock().unwrap();
    if let Some(r) = gate(&mut st, &h, format!("GET groups {q:?}")) {
        return r;
    }
    let list: Vec<&String> = st.groups.iter().filter(|g| q.get("name").is_none_or(|n| *g == n)).collect();
    let render = |g: &String| json!({"pk": group_uuid(g), "num_pk": 1, "name": g, "is_superuser": false, "parent": null, "attributes": {}});
    Json(page(list, &q, render)).into_response()
}

/// The chaos's fault for an API request, if it draws one: an error answer (Authentik's 5xx
/// page, a 429 with Retry-After), or the real answer late.
async fn chaos(State(f): State<Fake>, req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let path = req.uri().path_and_query().map_or(req.uri().path().to_string(), |p| p.to_string());
    let decision = f.lock().unwrap().chaos.decide(req.method().as_str(), &path, false);
    match decision {
        Some(Decision::Status { code, retry_after }) => {
            let mut r = (StatusCode::from_u16(code).unwrap(), "injected fault").into_response();
            if let Some(s) = retry_after {
                r.headers_mut().insert("retry-after", s.to_string().parse().unwrap());
            }
            r
        }
        Some(Decision::Delay(d)) => {
            tokio::time::sleep(d).await;
            next.run(req).await
        }
        Some(Decision::DropExec) | None => next.run(req).await,
    }
}

/// Starts the fake Authentik in this process with the test token and the groups of the
/// integration tests' registry; returns its state and base URL.
pub async fn fake_authentik() -> (Fake, String) {
    let (fake, url) = serve(TcpListener::bind("127.0.0.1:0").await.unwrap(), TOKEN);
    fake.lock().unwrap().groups = ["tenant-foo-users", "tenant-foo-ml", "tenant-bar-users"].map(String::from).to_vec();
    (fake, url)
}

/// Serves an empty Authentik accepting `token` on `listener` (with the control API under
/// `/_fake/`) until the runtime ends; returns its state and base URL.
pub fn serve(listener: TcpListener, token: &str) -> (Fake, String) {
    let fake: Fake = Arc::new(Mutex::new(FakeState { token: token.into(), ..Default::default() }));
    let app = Router::new()
        .route("/api/v3/core/users/", get(users))
        .route("/api/v3/core/users/{pk}/", get(user).patch(patch_user))
        .route("/api/v3/core/groups/", get(groups))
        // only the API routes above: the control API never fails
        .route_layer(axum::middleware::from_fn_with_state(fake.clone(), chaos))
        .nest("/_fake", control::router())
        .with_state(fake.clone());
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (fake, format!("http://{addr}"))
}

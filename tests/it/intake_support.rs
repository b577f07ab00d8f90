//! Intake test harness: a fake Authentik API speaking its wire format (an axum server), a fake
//! slurmdbd answering `sacctmgr show assoc` (the reconciler reads it through the real Slurm
//! backend), and the service's HTTP app with the intake wired as in `serve`.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use onramp::app::intake::IntakeSetup;
use onramp::backends::authentik::{AuthentikClient, AuthentikConfig};
use onramp::backends::exec::{Command, Output, RunFuture, Transport};
use onramp::backends::slurm::SlurmCli;
use onramp::domain::names::{ClusterName, SlurmAccount, Username};
use onramp::domain::secret::Secret;
use onramp::domain::tenants::TenantRegistry;
use onramp::engine::{Engine, Flow, Registry, StepCtx, StepFuture, Transition, WorkerStats};
use onramp::flows::reconcile::Brake;
use onramp::flows::user_offboard::USER_OFFBOARD;
use onramp::flows::user_onboard::USER_ONBOARD;
use onramp::intake::{SigningSecret, WebhookAuth};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::TestDb;

pub const TOKEN: &str = "ak-test-token";
pub const WHSEC: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

pub const TENANTS: &str = "\
tenants:
  - name: foo
    group: tenant-foo-users
    limits: { fairshare: 300, grp_tres: gres/gpu=16, grp_jobs: 50 }
    user_defaults: { default_qos: normal, qos: [normal], max_jobs: 20 }
    teams:
      - { account: ml-team-foo, group: tenant-foo-ml }
  - name: bar
    group: tenant-bar-users
";

#[derive(Clone, Debug)]
pub struct FakeUser {
    pub pk: i64,
    pub username: String,
    pub is_active: bool,
    pub groups: Vec<String>,
    pub attributes: Value,
}

/// Authentik's state and a log of the requests it saw.
#[derive(Default)]
pub struct FakeState {
    pub users: BTreeMap<i64, FakeUser>,
    pub groups: Vec<String>,
    /// Answers to give before the real one: (status, Retry-After seconds).
    pub fail_next: VecDeque<(u16, Option<u64>)>,
    pub requests: Vec<String>,
}

fn group_uuid(name: &str) -> String {
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
        }
    }
    fn json(&self) -> Value {
        json!({
            "pk": self.pk, "username": self.username, "name": format!("{} Example", self.username),
            "email": format!("{}@example.org", self.username), "is_active": self.is_active,
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

fn page(items: Vec<Value>, q: &BTreeMap<String, String>) -> Value {
    let size: usize = q.get("page_size").and_then(|s| s.parse().ok()).unwrap_or(20);
    let pageno: usize = q.get("page").and_then(|s| s.parse().ok()).unwrap_or(1);
    let total = items.len();
    let pages = total.div_ceil(size).max(1);
    let results: Vec<Value> = items.into_iter().skip((pageno - 1) * size).take(size).collect();
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
    if h.get("authorization").and_then(|v| v.to_str().ok()) != Some(&format!("Bearer {TOKEN}")) {
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
    let list: Vec<Value> = st
        .users
        .values()
        .filter(|u| q.get("username").is_none_or(|n| &u.username == n))
        .filter(|u| q.get("groups_by_name").is_none_or(|g| u.groups.contains(g)))
        .filter(|u| q.get("is_active").is_none_or(|a| (a == "true") == u.is_active))
        .map(FakeUser::json)
        .collect();
    Json(page(list, &q)).into_response()
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
    let list: Vec<Value> = st
        .groups
        .iter()
        .filter(|g| q.get("name").is_none_or(|n| *g == n))
        .map(|g| json!({"pk": group_uuid(g), "num_pk": 1, "name": g, "is_superuser": false, "parent": null, "attributes": {}}))
        .collect();
    Json(page(list, &q)).into_response()
}

/// Starts the fake Authentik; returns its state and base URL.
pub async fn fake_authentik() -> (Fake, String) {
    let fake: Fake = Arc::new(Mutex::new(FakeState {
        groups: ["tenant-foo-users", "tenant-foo-ml", "tenant-bar-users"].map(String::from).to_vec(),
        ..Default::default()
    }));
    let app = Router::new()
        .route("/api/v3/core/users/", get(users))
        .route("/api/v3/core/users/{pk}/", get(user).patch(patch_user))
        .route("/api/v3/core/groups/", get(groups))
        .with_state(fake.clone());
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (fake, format!("http://{addr}"))
}

pub fn client(url: &str) -> AuthentikClient {
    AuthentikClient::new(AuthentikConfig {
        url: url.into(),
        token: Secret::new(TOKEN),
        timeout: Duration::from_secs(5),
        attempts: 3,
        backoff: Duration::from_millis(50),
        page_size: 100,
    })
    .unwrap()
}

/// The cluster's associations, settable by the test. As a transport it answers the Slurm
/// backend's `sacctmgr -n -P show assoc where account=… cluster=… format=…` the way sacctmgr does.
#[derive(Clone, Default)]
pub struct FakeCluster(pub Arc<Mutex<Vec<(SlurmAccount, Username)>>>);

impl FakeCluster {
    pub fn set(&self, pairs: &[(&str, &str)]) {
        *self.0.lock().unwrap() =
            pairs.iter().map(|(a, u)| (SlurmAccount::parse(a).unwrap(), Username::parse(u).unwrap())).collect();
    }

    /// The Slurm backend over this fake, as the reconciler gets it.
    pub fn slurm(&self) -> Arc<SlurmCli> {
        Arc::new(SlurmCli::new(Arc::new(self.clone()), ClusterName::parse("production").unwrap()))
    }
}

impl Transport for FakeCluster {
    fn run<'a>(&'a self, cmd: &'a Command, _timeout: Duration) -> RunFuture<'a> {
        let argv = cmd.argv();
        let arg = |key: &str| argv.iter().find_map(|a| a.strip_prefix(key)).map(str::to_string);
        let reply = match (argv.get(4).map(String::as_str), arg("account="), arg("cluster=")) {
            (Some("assoc"), Some(accounts), Some(cluster)) => {
                let accounts: Vec<&str> = accounts.split(',').collect();
                let rows: String = self
                    .0
                    .lock()
                    .unwrap()
                    .iter()
                    .filter(|(a, _)| accounts.contains(&a.as_str()))
                    .map(|(a, u)| format!("{cluster}|{a}|{u}|||1||||||||\n"))
                    .collect();
                Output { code: 0, stdout: rows, stderr: String::new() }
            }
            _ => Output { code: 1, stdout: String::new(), stderr: format!("fake slurmdbd: not simulated: {cmd}\n") },
        };
        Box::pin(async move { Ok(reply) })
    }
}

/// Stands in for the onboarding/offboarding flows (built by the flows issue) so that the engine
/// accepts their kinds; it does nothing and records nothing.
pub struct Recorded(pub &'static str);

impl Flow for Recorded {
    fn kind(&self) -> &'static str {
        self.0
    }
    fn steps(&self) -> &'static [&'static str] {
        &["recorded"]
    }
    fn run<'a>(&'a self, _: usize, _: &'a StepCtx) -> StepFuture<'a> {
        Box::pin(async { Transition::NeedsApproval("test stand-in".into()) })
    }
}

pub struct App {
    pub engine: Engine,
    /// The service's address (`http://127.0.0.1:port`).
    pub base: String,
    /// The webhook's URL.
    pub url: String,
    pub fake: Fake,
    pub cluster: FakeCluster,
    pub http: reqwest::Client,
    pub stop: CancellationToken,
}

impl Drop for App {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

pub struct AppOptions {
    pub auth: WebhookAuth,
    pub max_body: usize,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            auth: WebhookAuth {
                signing_secrets: vec![WHSEC.parse::<SigningSecret>().unwrap()],
                bearer_tokens: vec![],
                tolerance: Duration::from_secs(300),
            },
            max_body: 1 << 20,
        }
    }
}

/// The service's HTTP app (no worker: tests start one when they want jobs to run).
pub async fn app(db: &TestDb, opts: AppOptions) -> App {
    let (fake, ak_url) = fake_authentik().await;
    let cluster = FakeCluster::default();
    let tenants = Arc::new(TenantRegistry::parse(TENANTS, "test").unwrap());
    let setup = IntakeSetup {
        authentik: Arc::new(client(&ak_url)),
        tenants,
        brake: Brake::default(),
        auth: opts.auth,
        settle: Duration::ZERO,
        max_body: opts.max_body,
        writers: std::env::var("WRITERS").ok().and_then(|n| n.parse().ok()).unwrap_or(2),
        batch: 512,
        reconcile_interval: Duration::ZERO,
    };
    let registry = setup.registry(
        Registry::new()
            .with(Recorded(USER_ONBOARD))
            .with(Recorded(USER_OFFBOARD))
            .with(Recorded(onramp::flows::tenant::TENANT_ONBOARD))
            .with(Recorded(onramp::flows::tenant::TENANT_OFFBOARD)),
        cluster.slurm(),
    );
    let engine = Engine::new(db.pool.clone(), registry);
    let intake = setup.start(&engine);
    let mut state = onramp::http::AppState::new(engine.clone(), Arc::new(WorkerStats::default()));
    state.intake = Some(intake);
    state.tenants = Some(setup.tenants.clone());
    let authentik = Some(setup.authentik.clone());
    state.plans = Some(Arc::new(onramp::dryrun::plan::Planner { cfg: dry_config(), authentik }));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(onramp::http::serve(l, state, stop.clone()));
    App {
        engine,
        base: format!("http://{addr}"),
        url: format!("http://{addr}/webhooks/authentik"),
        fake,
        cluster,
        http: reqwest::Client::new(),
        stop,
    }
}

/// Plans with the settings' defaults.
pub fn dry_config() -> onramp::dryrun::sim::DryConfig {
    onramp::dryrun::sim::DryConfig {
        cluster: onramp::domain::names::ClusterName::parse("production").unwrap(),
        k8s: onramp::backends::kubernetes::K8sSettings::default(),
        storage: onramp::backends::storage::StorageSettings::default(),
        timings: onramp::flows::Timings::default(),
        archive_dir: onramp::backends::slurm::HostPath::parse("/var/spool/slurm/archive").unwrap(),
        login_address: "login.example".into(),
        notify: true,
        batch_window: Duration::ZERO,
    }
}

pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

/// A structured body as our blueprint's mapping produces it.
pub fn structured(event_uuid: &str, action: &str, model: Value, diff: Option<Value>) -> Value {
    let mut context = json!({ "model": model, "http_request": { "path": "/api/v3/core/users/42/", "method": "PATCH",
                                                                "request_id": "abc", "user_agent": "test" } });
    if let Some(d) = &diff {
        context["diff"] = d.clone();
    }
    json!({ "event_uuid": event_uuid, "action": action, "app": "authentik.events.models", "model": model,
            "diff": diff, "actor": { "pk": 1, "username": "akadmin", "email": "root@example.org" },
            "context": context, "created": "2026-11-30T00:00:00+00:00" })
}

pub fn user_model(pk: i64) -> Value {
    json!({"app": "authentik_core", "model_name": "user", "pk": pk, "name": "Some Body"})
}

pub fn group_model(name: &str) -> Value {
    json!({"app": "authentik_core", "model_name": "group", "pk": group_uuid(name), "name": name})
}

impl App {
    /// POSTs `body` signed with the test secret (a fresh webhook-id per call unless given).
    pub async fn post_signed(&self, body: &Value, id: Option<&str>) -> reqwest::Response {
        let raw = serde_json::to_vec(body).unwrap();
        let id = id.map(str::to_string).unwrap_or_else(|| format!("msg_{}", uuid::Uuid::new_v4().simple()));
        self.post_raw(&raw, &id, now(), WHSEC).await
    }

    pub async fn post_raw(&self, raw: &[u8], id: &str, ts: i64, secret: &str) -> reqwest::Response {
        let key: SigningSecret = secret.parse().unwrap();
        self.http
            .post(&self.url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", ts.to_string())
            .header("webhook-signature", key.sign(id, ts, raw))
            .body(raw.to_vec())
            .send()
            .await
            .unwrap()
    }

    pub async fn jobs(&self, kind: &str) -> Vec<(i64, String, Option<String>, Value)> {
        sqlx::query_as("select id, state, dedupe_key, input from jobs where kind = $1 order by id")
            .bind(kind)
            .fetch_all(self.engine.pool())
            .await
            .unwrap()
    }

    pub fn add_user(&self, u: FakeUser) {
        self.fake.lock().unwrap().users.insert(u.pk, u);
    }
}

//! Intake test harness: the fake Authentik API (from `onramp-fakes`), a fake
//! slurmdbd answering `sacctmgr show assoc` (the reconciler reads it through the real Slurm
//! backend), and the service's HTTP app with the intake wired as in `serve`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onramp::app::intake::IntakeSetup;
use onramp::backends::authentik::{AuthentikClient, AuthentikConfig};
use onramp::backends::exec::{Command, Output, RunFuture, Transport};
use onramp::backends::slurm::{Limit, SlurmCli, UserLimits};
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
pub use onramp_fakes::authentik::{Fake, FakeUser, TOKEN, fake_authentik, group_uuid};

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

pub fn client(url: &str) -> AuthentikClient {
    AuthentikClient::new(AuthentikConfig {
        url: url.into(),
        token: Secret::new(TOKEN),
        timeout: Duration::from_secs(5),
        attempts: 3,
        backoff: Duration::from_millis(50),
        page_size: 100,
        concurrency: 32,
    })
    .unwrap()
}

/// The cluster's associations, settable by the test. As a transport it answers the Slurm
/// backend's `sacctmgr -n -P show assoc where account=… cluster=… format=…` the way sacctmgr does,
/// each association with the limits its tenant gives its users (what an onboarding set), or
/// `Fairshare=1` and nothing else under an account of no tenant.
#[derive(Clone, Default)]
pub struct FakeCluster(
    pub Arc<Mutex<Vec<(SlurmAccount, Username)>>>,
    /// Each tenant account's limit columns (see [`limit_columns`]).
    Arc<BTreeMap<String, String>>,
    /// An association's own limit columns, (account, user) → columns: a drifted association.
    Arc<Mutex<BTreeMap<(String, String), String>>>,
);

impl FakeCluster {
    /// Associations under the accounts of `tenants` show those tenants' user limits.
    pub fn for_tenants(tenants: &TenantRegistry) -> Self {
        let mut limits = BTreeMap::new();
        for t in &tenants.tenants {
            let row = limit_columns(&onramp::flows::specs::user_limits(t).unwrap());
            limits.extend(t.accounts().into_iter().map(|a| (a.to_string(), row.clone())));
        }
        Self(Arc::default(), Arc::new(limits), Arc::default())
    }

    /// The association (account, user) shows these limit columns (share, grpjobs, grpsubmit,
    /// grptres, grptresmins, maxjobs, maxsubmit, qos, defaultqos) instead of its tenant's.
    pub fn drift(&self, account: &str, user: &str, columns: &str) {
        self.2.lock().unwrap().insert((account.into(), user.into()), columns.into());
    }

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
                    .map(|(a, u)| {
                        let own = self.2.lock().unwrap().get(&(a.to_string(), u.to_string())).cloned();
                        let limits = own.or_else(|| self.1.get(a.as_str()).cloned());
                        format!("{cluster}|{a}|{u}|||{}\n", limits.as_deref().unwrap_or("1||||||||"))
                    })
                    .collect();
                Output { code: 0, stdout: rows, stderr: String::new() }
            }
            _ => Output { code: 1, stdout: String::new(), stderr: format!("fake slurmdbd: not simulated: {cmd}\n") },
        };
        Box::pin(async move { Ok(reply) })
    }
}

/// `ASSOC_FORMAT`'s columns from the share on (share, grpjobs, grpsubmit, grptres, grptresmins,
/// maxjobs, maxsubmit, qos, defaultqos) of an association with these limits.
fn limit_columns(l: &UserLimits) -> String {
    let count = |x: Option<Limit>| match x {
        Some(Limit::At(n)) => n.to_string(),
        _ => String::new(),
    };
    let mut qos: Vec<&str> = l.qos.iter().flatten().map(|q| q.as_str()).collect();
    qos.sort();
    format!(
        "{}|{}|||{}|{}||{}|{}",
        l.fairshare.map_or("1".into(), |f| f.arg()),
        count(l.grp_jobs),
        l.grp_tres_mins.as_ref().map(ToString::to_string).unwrap_or_default(),
        count(l.max_jobs),
        qos.join(","),
        l.default_qos.as_ref().map(|q| q.as_str()).unwrap_or_default()
    )
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
    pub brake: Brake,
    pub max_diff_users: usize,
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
            brake: Brake::default(),
            max_diff_users: 200,
        }
    }
}

/// The intake's settings as the tests use them (no settle delay), against the fake Authentik at
/// `ak_url`.
pub fn setup(ak_url: &str, opts: AppOptions) -> IntakeSetup {
    IntakeSetup {
        authentik: Arc::new(client(ak_url)),
        tenants: Arc::new(TenantRegistry::parse(TENANTS, "test").unwrap()),
        brake: opts.brake,
        auth: opts.auth,
        settle: Duration::ZERO,
        max_body: opts.max_body,
        max_diff_users: opts.max_diff_users,
        writers: std::env::var("WRITERS").ok().and_then(|n| n.parse().ok()).unwrap_or(2),
        batch: 512,
        reconcile_interval: Duration::ZERO,
    }
}

/// The engine with the reconcile flows (reading `cluster`) and stand-ins for the others.
pub fn engine(db: &TestDb, setup: &IntakeSetup, cluster: &FakeCluster) -> Engine {
    let registry = setup.registry(
        Registry::new()
            .with(Recorded(USER_ONBOARD))
            .with(Recorded(USER_OFFBOARD))
            .with(Recorded(onramp::flows::tenant::TENANT_ONBOARD))
            .with(Recorded(onramp::flows::tenant::TENANT_OFFBOARD)),
        cluster.slurm(),
    );
    Engine::new(db.pool.clone(), registry)
}

/// The service's HTTP app with the delivery pump (no worker: tests start one when they want jobs
/// to run).
pub async fn app(db: &TestDb, opts: AppOptions) -> App {
    let (fake, ak_url) = fake_authentik().await;
    let setup = setup(&ak_url, opts);
    let cluster = FakeCluster::for_tenants(&setup.tenants);
    let engine = engine(db, &setup, &cluster);
    let stop = CancellationToken::new();
    let intake = setup.start(&engine, stop.clone());
    let mut state = onramp::http::AppState::new(engine.clone(), Arc::new(WorkerStats::default()));
    state.intake = Some(intake);
    state.tenants = Some(setup.tenants.clone());
    let authentik = Some(setup.authentik.clone());
    state.authentik = authentik.clone();
    state.plans = Some(Arc::new(onramp::dryrun::plan::Planner { cfg: dry_config(), authentik }));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
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

    /// The jobs of `kind`, once the pump has processed every stored delivery.
    pub async fn jobs(&self, kind: &str) -> Vec<(i64, String, Option<String>, Value)> {
        pumped(&self.engine).await;
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

/// Waits (polling, with a deadline) until no stored delivery is left for the pump.
pub async fn pumped(engine: &Engine) {
    crate::common::eventually(Duration::from_secs(30), "the pump to process every stored delivery", || async {
        let n: i64 = sqlx::query_scalar("select count(*) from webhook_deliveries where processed_at is null")
            .fetch_one(engine.pool())
            .await
            .unwrap();
        (n == 0).then_some(())
    })
    .await;
}

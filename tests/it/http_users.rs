//! The users API (issue 15): each user's state in a tenant and why, reached by real jobs — the
//! reconciler, the onboarding and offboarding flows — on the simulated cluster with the fake
//! Authentik; who may ask (a scoped token: its own tenant only); names refused with a human
//! message; and the tenants overview's drift counts staying fresh as onboardings finish after
//! the reconcile that asked for them.
//!
//! Timers (the propagation wait, the retention) are an hour long, so that users stay where a
//! state is read; the test moves a waiting job's timer to now to let it go on.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use onramp::backends::exec::{Command, Output, RunFuture, Transport};
use onramp::backends::slurm::{Slurm, SlurmCli};
use onramp::domain::names::{ClusterName, Username};
use onramp::domain::tenants::TenantRegistry;
use onramp::dryrun::sim;
use onramp::effects::EffectLog;
use onramp::engine::{Actor, Engine, JobState, WorkerStats};
use onramp::flows::reconcile::{Brake, Reconciler, tenant_job};
use onramp::flows::{Backends, Timings, specs, user_offboard, user_onboard};
use onramp::http::access::Role;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::flows_support::KEY;
use crate::http_api::token;
use crate::intake_support::{Fake, FakeUser, client, dry_config, fake_authentik};

const T: Duration = Duration::from_secs(60);

const TENANTS: &str = "\
uid_offset: 5000
gid_offset: 5000
tenants:
  - name: foo
    group: tenant-foo-users
    limits: { fairshare: 300, grp_tres: gres/gpu=16, grp_jobs: 50 }
    user_defaults: { default_qos: normal, qos: [normal], max_jobs: 20 }
  - name: bar
    group: tenant-bar-users
";

/// The user whose jobs keep running on the cluster (squeue shows one), so her drain never ends.
const BUSY: &str = "erin";

/// The simulated slurmctld host, except that squeue shows a running job of [`BUSY`].
struct Busy(Arc<dyn Transport>);

impl Transport for Busy {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        let argv = cmd.argv();
        if argv[0] == "squeue" && argv.iter().any(|a| a == &format!("--user={BUSY}")) {
            let line = format!("4711|{BUSY}|tenant-foo|RUNNING|None\n");
            return Box::pin(async move { Ok(Output { code: 0, stdout: line, stderr: String::new() }) });
        }
        self.0.run(cmd, timeout)
    }
}

struct Site {
    engine: Engine,
    base: String,
    http: reqwest::Client,
    fake: Fake,
    /// The simulated cluster's Slurm, for seeding.
    slurm: Arc<dyn Slurm>,
    stop: CancellationToken,
    worker: Option<TestWorker>,
    _db: TestDb,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(w) = &self.worker {
            w.stop.cancel();
        }
    }
}

fn timings() -> Timings {
    Timings {
        key_poll: Duration::from_millis(100),
        key_deadline: Duration::from_secs(5),
        propagation: Duration::from_secs(3600),
        restart_wait: Duration::from_millis(200),
        drain_poll: Duration::from_millis(200),
        drain_deadline: Duration::from_secs(2),
        cleanup_poll: Duration::from_millis(100),
        cleanup_deadline: Duration::from_secs(5),
        retention: Duration::from_secs(3600),
        retry_initial: Duration::from_millis(100),
        retry_max: Duration::from_secs(5),
        retry_attempts: 8,
    }
}

/// The API, the user and reconcile flows on the simulated cluster (tenants onboarded there), the
/// fake Authentik, and a worker.
async fn site(brake: Brake) -> Site {
    let db = TestDb::new().await;
    let (fake, ak_url) = fake_authentik().await;
    fake.lock().unwrap().groups.extend(["tenant-foo-users".to_string(), "tenant-bar-users".to_string()]);
    let tenants = Arc::new(TenantRegistry::parse(TENANTS, "test").unwrap());
    let mut cfg = dry_config();
    cfg.timings = timings();
    let world = sim::World::new(&cfg.cluster, cfg.k8s.clone());
    let cluster = ClusterName::parse("production").unwrap();
    let authentik: Arc<dyn onramp::backends::authentik::Authentik> = Arc::new(client(&ak_url));
    let sim = sim::backends(&cfg, &world, authentik.clone(), tenants.clone(), &EffectLog::default()).unwrap();
    let slurm: Arc<dyn Slurm> = Arc::new(SlurmCli::new(Arc::new(Busy(world.slurm_host())), cluster));
    for t in &tenants.tenants {
        slurm.ensure_tenant(&specs::tenant_spec(t).unwrap()).await.unwrap();
    }
    let backends = Backends::new(
        slurm.clone(),
        sim.k8s.clone(),
        sim.k8s_settings.clone(),
        sim.storage.clone(),
        sim.notifier.clone(),
        sim.authentik.clone(),
        tenants.clone(),
        timings(),
        sim.archive_dir.clone(),
        sim.login_address.clone(),
    );
    let reconciler = Reconciler::new(authentik.clone(), tenants.clone(), slurm.clone(), brake);
    let registry =
        onramp::flows::with_reconcile(onramp::flows::with_backends(onramp::flows::registry(), backends), reconciler);
    let engine = Engine::new(db.pool.clone(), registry);
    let mut state = onramp::http::AppState::new(engine.clone(), Arc::new(WorkerStats::default()));
    state.tenants = Some(tenants);
    state.authentik = Some(authentik);
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(onramp::http::serve(l, state, stop.clone()));
    let mut wc = worker_config("users", Duration::from_secs(30));
    wc.poll_interval = Duration::from_millis(100);
    let worker = Some(TestWorker::start(&engine, wc));
    let base = format!("http://{addr}");
    Site { engine, base, http: reqwest::Client::new(), fake, slurm, stop, worker, _db: db }
}

impl Site {
    fn user(&self, pk: i64, name: &str, groups: &[&str], key: bool) {
        let mut u = FakeUser::new(pk, name, groups);
        if key {
            u.attributes = serde_json::json!({ "sshPublicKey": KEY });
        }
        self.fake.lock().unwrap().users.insert(pk, u);
    }

    async fn get(&self, token: &str, path: &str) -> (StatusCode, String, Value) {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        let status = r.status();
        let ct = r.headers().get("content-type").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
        (status, ct, r.json().await.unwrap_or(Value::Null))
    }

    /// The tenant's users by name (the list answer), and the answer.
    async fn users(&self, token: &str) -> (BTreeMap<String, Value>, Value) {
        let (status, _, body) = self.get(token, "/v1/tenants/foo/users").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let users = body["users"].as_array().unwrap();
        let names: Vec<&str> = users.iter().map(|u| u["username"].as_str().unwrap()).collect();
        let mut sorted = names.clone();
        sorted.sort_unstable();
        assert_eq!(names, sorted, "sorted by username");
        (users.iter().map(|u| (u["username"].as_str().unwrap().to_string(), u.clone())).collect(), body)
    }

    /// Polls the list until `user` is in `state`; returns their status.
    async fn reaches(&self, token: &str, user: &str, state: &str) -> Value {
        self.reaches_at(token, user, state, None).await
    }

    /// Polls the list until `user` is in `state` (at `step`, when given); returns their status.
    async fn reaches_at(&self, token: &str, user: &str, state: &str, step: Option<&str>) -> Value {
        eventually(T, &format!("{user} to be {state} at {step:?}"), || async {
            let (users, _) = self.users(token).await;
            users.get(user).filter(|u| u["state"] == state && step.is_none_or(|s| u["step"] == s)).cloned()
        })
        .await
    }

    /// Runs a waiting job's timer out now, until the job is in `state`.
    async fn drive(&self, id: i64, state: JobState) {
        eventually(T, &format!("job {id} to be {state}"), || async {
            sqlx::query("update jobs set run_at = now() where id = $1 and state = 'waiting'")
                .bind(id)
                .execute(self.engine.pool())
                .await
                .unwrap();
            (self.engine.job(id).await.unwrap().state == state).then_some(())
        })
        .await;
    }

    /// Runs a reconcile of tenant foo; returns its report's onboard/offboard job of each user.
    async fn reconcile(&self) -> BTreeMap<String, i64> {
        let id = self.engine.enqueue(&[tenant_job("foo", Actor::cli("test"), "test")]).await.unwrap()[0].id;
        let job = wait_state(&self.engine, id, "succeeded", T).await;
        let entry = &job.outputs["reconcile"]["tenants"][0];
        assert_eq!(entry["tenant"], "foo", "{entry}");
        entry["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| (j["username"].as_str().unwrap().to_string(), j["job"].as_i64().unwrap()))
            .collect()
    }

    async fn drift(&self, token: &str) -> Value {
        let (status, _, t) = self.get(token, "/v1/tenants/foo").await;
        assert_eq!(status, StatusCode::OK, "{t}");
        t["drift"].clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_state_comes_from_real_jobs_and_the_tenant_counts_stay_fresh() {
    let s = site(Brake::default()).await;
    let viewer = token(&s.engine, "viewer", Role::Viewer, None).await;
    let members = ["alice", "bob", "carol", "dave", "erin", "frank"];
    for (pk, name) in (1..).zip(members) {
        s.user(pk, name, &["tenant-foo-users"], name != "bob");
    }
    s.user(7, "gina", &[], true);

    // no job, no reconcile yet: the group's members, as Authentik lists them now, not onboarded
    let (users, body) = s.users(&viewer).await;
    assert!(body["as_of"].is_null(), "{body}");
    let listed: Vec<&str> = body["users"].as_array().unwrap().iter().map(|u| u["username"].as_str().unwrap()).collect();
    assert_eq!(listed, members, "{body}");
    assert!(users.values().all(|u| u["state"] == "not_onboarded" && u["member"] == true), "{body}");

    // the reconcile finds six members with no association and starts their onboardings
    let started = s.reconcile().await;
    assert_eq!(started.keys().map(String::as_str).collect::<Vec<_>>(), members);
    let drift = s.drift(&viewer).await;
    assert_eq!((drift["onboard"].as_u64(), drift["measured"]["onboard"].as_u64()), (Some(6), Some(6)), "{drift}");

    // each onboarding waits out the propagation; bob has no key
    let dave = s.reaches_at(&viewer, "dave", "onboarding", Some("propagation_wait")).await;
    assert!(
        dave["reason"].as_str().unwrap().starts_with("onboarding at step propagation_wait, attempt 1 of 8"),
        "{dave}"
    );
    assert_eq!((dave["member"].as_bool(), dave["job"].as_i64()), (Some(true), Some(started["dave"])), "{dave}");
    let (_, body) = s.users(&viewer).await;
    assert!(body["as_of"].is_string(), "the reconcile's time: {body}");
    let bob = s.reaches(&viewer, "bob", "waiting_for_key").await;
    assert!(bob["reason"].as_str().unwrap().contains("SSH public key"), "{bob}");
    assert_eq!(bob["step"], "resolve_user", "{bob}");

    // alice, carol and erin are onboarded: the tenant's drift says so at once
    for u in ["alice", "carol", "erin"] {
        s.drive(started[u], JobState::Succeeded).await;
    }
    let alice = s.reaches(&viewer, "alice", "onboarded").await;
    assert_eq!((alice["step"].clone(), alice["member"].as_bool()), (Value::Null, Some(true)), "{alice}");
    let assoc = &alice["association"];
    assert_eq!(
        (assoc["account"].as_str(), assoc["limits"]["max_jobs"].as_i64()),
        (Some("tenant-foo"), Some(20)),
        "{alice}"
    );
    assert!(assoc["read_at"].is_string() && assoc["blocked"] == false, "{alice}");
    let drift = s.drift(&viewer).await;
    assert_eq!(drift["onboard"].as_u64(), Some(3), "six measured, three onboarded since: {drift}");
    assert_eq!(drift["settled_since"]["onboarded"].as_u64(), Some(3), "{drift}");
    assert_eq!(drift["measured"]["onboard"].as_u64(), Some(6), "{drift}");
    assert!(drift["as_of"].as_str().unwrap() >= drift["measured_at"].as_str().unwrap(), "{drift}");

    // gina is in no group of the tenant: her onboarding (asked for by hand) fails
    let gina = user_onboard::Input {
        tenant: "foo".into(),
        account: "tenant-foo".into(),
        username: "gina".into(),
        ..Default::default()
    };
    let gina_job = s.engine.enqueue(&[gina.job(Actor::api("portal"))]).await.unwrap()[0].id;
    let gina = s.reaches(&viewer, "gina", "failed").await;
    // Authentik, read now, has her in no group of the tenant
    assert_eq!((gina["job"].as_i64(), gina["member"].clone()), (Some(gina_job), Value::Bool(false)), "{gina}");
    assert!(gina["reason"].as_str().unwrap().starts_with("failed at step resolve_user: "), "{gina}");

    // carol leaves the group: the next reconcile offboards her, and she is kept for the retention
    s.fake.lock().unwrap().users.get_mut(&3).unwrap().groups.clear();
    let second = s.reconcile().await;
    let carol_off = second["carol"];
    let carol = eventually(T, "carol in retention", || async {
        let (users, _) = s.users(&viewer).await;
        users.get("carol").filter(|u| u["state"] == "in_retention" && u["retention_until"].is_string()).cloned()
    })
    .await;
    assert_eq!((carol["member"].as_bool(), carol["job"].as_i64()), (Some(false), Some(carol_off)), "{carol}");
    assert_eq!(carol["association"]["blocked"], true, "{carol}");
    assert!(carol["reason"].as_str().unwrap().contains("kept until"), "{carol}");
    s.drive(carol_off, JobState::Succeeded).await;
    let carol = s.reaches(&viewer, "carol", "offboarded").await;
    assert!(carol["association"].is_null(), "deleted: {carol}");

    // frank's onboarding is cancelled: he is a member not onboarded
    let ops = token(&s.engine, "ops", Role::Operator, None).await;
    let r =
        s.http.post(format!("{}/v1/jobs/{}/cancel", s.base, second["frank"])).bearer_auth(&ops).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let frank = s.reaches(&viewer, "frank", "not_onboarded").await;
    assert!(frank["reason"].as_str().unwrap().contains("cancelled"), "{frank}");

    // erin's offboarding: blocked while her job runs, then a hard cutoff waits for approval
    let erin = user_offboard::Input {
        tenant: "foo".into(),
        account: "tenant-foo".into(),
        username: "erin".into(),
        ..Default::default()
    };
    let erin_off = s.engine.enqueue(&[erin.job(Actor::api("portal"))]).await.unwrap()[0].id;
    let erin = s.reaches(&viewer, "erin", "blocked").await;
    assert_eq!(erin["job"].as_i64(), Some(erin_off), "{erin}");
    let erin = s.reaches_at(&viewer, "erin", "waiting_for_approval", Some("drain")).await;
    let why = erin["reason"].as_str().unwrap();
    assert!(why.starts_with("waiting for approval: ") && why.contains("hard cutoff"), "{erin}");

    // one user, with their jobs, newest first
    let (status, _, alice) = s.get(&viewer, "/v1/tenants/foo/users/alice").await;
    assert_eq!((status, alice["state"].as_str()), (StatusCode::OK, Some("onboarded")), "{alice}");
    let ids: Vec<i64> = alice["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [started["alice"]], "{alice}");
    let (_, _, erin) = s.get(&viewer, "/v1/tenants/foo/users/erin").await;
    let ids: Vec<i64> = erin["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_i64().unwrap()).collect();
    assert_eq!(ids, [erin_off, started["erin"]], "newest first: {erin}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_users_and_tenants_are_404_bad_names_400_and_scoped_tokens_see_their_own_tenant() {
    let s = site(Brake::default()).await;
    s.user(1, "alice", &["tenant-foo-users"], true);
    s.reconcile().await;
    let viewer = token(&s.engine, "viewer", Role::Viewer, None).await;
    let own = token(&s.engine, "foo-viewer", Role::Viewer, Some("foo")).await;
    let other = token(&s.engine, "bar-viewer", Role::Viewer, Some("bar")).await;

    let problem = |status: StatusCode, ct: &str, body: &Value, want: StatusCode, says: &str| {
        assert_eq!(status, want, "{body}");
        assert_eq!(ct, "application/problem+json");
        assert!(body["detail"].as_str().unwrap().contains(says), "{body}");
    };
    let (st, ct, b) = s.get(&viewer, "/v1/tenants/foo/users/nobody").await;
    problem(st, &ct, &b, StatusCode::NOT_FOUND, "onramp knows nothing of user nobody in tenant foo");
    let (st, ct, b) = s.get(&viewer, "/v1/tenants/nowhere/users").await;
    problem(st, &ct, &b, StatusCode::NOT_FOUND, "tenant \"nowhere\" not found");
    let (st, ct, b) = s.get(&viewer, "/v1/tenants/foo/users/Alice%20B").await;
    problem(st, &ct, &b, StatusCode::BAD_REQUEST, "username \"Alice B\" is not allowed");

    // a scoped token: its own tenant only, another's is not found
    for path in ["/v1/tenants/foo/users", "/v1/tenants/foo/users/alice"] {
        assert_eq!(s.get(&own, path).await.0, StatusCode::OK, "{path}");
        let (st, ct, b) = s.get(&other, path).await;
        problem(st, &ct, &b, StatusCode::NOT_FOUND, "tenant \"foo\" not found");
    }
    let (_, _, alice) = s.get(&own, "/v1/tenants/foo/users/alice").await;
    assert_eq!(alice["tenant"], "foo", "{alice}");
    assert!(alice["jobs"].as_array().unwrap().iter().all(|j| j["subject"] == "foo/alice"), "{alice}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offboarding_the_safety_brake_holds_waits_for_approval() {
    // a brake that holds every offboarding
    let s = site(Brake { min_users: 0, max_percent: 0, window: Duration::from_secs(3600) }).await;
    let viewer = token(&s.engine, "viewer", Role::Viewer, None).await;
    let ops = token(&s.engine, "ops", Role::Operator, None).await;
    // hank has an association under the tenant's account but is in no group of it
    s.user(8, "hank", &[], true);
    let t = TenantRegistry::parse(TENANTS, "test").unwrap();
    let limits = specs::user_limits(&t.tenants[0]).unwrap();
    let account = onramp::domain::names::SlurmAccount::parse("tenant-foo").unwrap();
    s.slurm.add_users(&account, &[Username::parse("hank").unwrap()], true, &limits).await.unwrap();

    let id = s.engine.enqueue(&[tenant_job("foo", Actor::cli("test"), "test")]).await.unwrap()[0].id;
    let report = wait_state(&s.engine, id, "succeeded", T).await.outputs;
    let hold = report["reconcile"]["tenants"][0]["hold_job"].as_i64().expect("the brake held hank's offboarding");
    wait_state(&s.engine, hold, "needs_approval", T).await;
    let hank = s.reaches(&viewer, "hank", "waiting_for_approval").await;
    assert_eq!((hank["job"].as_i64(), hank["member"].as_bool()), (Some(hold), Some(false)), "{hank}");
    assert!(hank["reason"].as_str().unwrap().starts_with("waiting for approval: the safety brake holds"), "{hank}");

    // a person releases the hold: hank's offboarding runs, and he is kept for the retention
    let r = s.http.post(format!("{}/v1/jobs/{hold}/approve", s.base)).bearer_auth(&ops).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let hank = s.reaches(&viewer, "hank", "in_retention").await;
    assert_ne!(hank["job"].as_i64(), Some(hold), "{hank}");
}

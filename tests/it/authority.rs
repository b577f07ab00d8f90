//! Who may act on whom (issue 13: defects 1, 10, 11): a user offboarding reaches only a user of
//! the tenant (at the API and in the flow's first step) and never deactivates an Authentik
//! account still in another tenant's group; hard cutoffs and tenant offboardings need the admin
//! role and a second person's approval (four eyes); plans for a scoped token only for its
//! tenant's users; tokens only for registry tenants; the reconciler's jobs only for unscoped
//! tokens.
//!
//! The real user and tenant flows run on the simulated cluster of `onramp plan` (every Slurm
//! command recorded), with the fake Authentik speaking its real API.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use onramp::backends::slurm::{Slurm, SlurmCli};
use onramp::domain::names::{ClusterName, Username};
use onramp::domain::tenants::TenantRegistry;
use onramp::dryrun::sim;
use onramp::effects::EffectLog;
use onramp::engine::{Actor, Engine, Flow, FourEyes, JobState, NewJob, StepCtx, StepFuture, Transition, WorkerStats};
use onramp::flows::{specs, user_offboard};
use onramp::http::access::Role;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::http_api::token;
use crate::intake_support::{Fake, FakeUser, TENANTS, client, dry_config, fake_authentik};

const T: Duration = Duration::from_secs(60);

struct Site {
    engine: Engine,
    base: String,
    http: reqwest::Client,
    fake: Fake,
    /// Every call the flows made to the simulated cluster.
    log: EffectLog,
    /// The simulated cluster's Slurm, for seeding and reading back.
    slurm: SlurmCli,
    stop: CancellationToken,
    _worker: Option<TestWorker>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(w) = &self._worker {
            w.stop.cancel();
        }
    }
}

/// The API with the real user and tenant flows on the simulated cluster (tenants foo and bar
/// onboarded there), the fake Authentik, and (`worker`) a worker running them.
async fn site(db: &TestDb, worker: bool) -> Site {
    let (fake, ak_url) = fake_authentik().await;
    let tenants = Arc::new(TenantRegistry::parse(TENANTS, "test").unwrap());
    let cfg = dry_config();
    let world = sim::World::new(&cfg.cluster, cfg.k8s.clone());
    let slurm = SlurmCli::new(world.slurm_host(), ClusterName::parse("production").unwrap());
    for t in &tenants.tenants {
        slurm.ensure_tenant(&specs::tenant_spec(t).unwrap()).await.unwrap();
    }
    let log = EffectLog::default();
    let authentik: Arc<dyn onramp::backends::authentik::Authentik> = Arc::new(client(&ak_url));
    let backends = sim::backends(&cfg, &world, authentik.clone(), tenants.clone(), &log).unwrap();
    // the reconcile kinds are accepted (declared), not run
    let registry = onramp::flows::declare_all(onramp::flows::with_backends(onramp::flows::registry(), backends));
    let engine = Engine::new(db.pool.clone(), registry);
    let mut state = onramp::http::AppState::new(engine.clone(), Arc::new(WorkerStats::default()));
    state.tenants = Some(tenants);
    state.authentik = Some(authentik.clone());
    state.plans = Some(Arc::new(onramp::dryrun::plan::Planner { cfg, authentik: Some(authentik) }));
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = l.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(onramp::http::serve(l, state, stop.clone()));
    let worker = worker.then(|| TestWorker::start(&engine, worker_config("authority", Duration::from_secs(10))));
    Site {
        engine,
        base: format!("http://{addr}"),
        http: reqwest::Client::new(),
        fake,
        log,
        slurm,
        stop,
        _worker: worker,
    }
}

impl Site {
    fn user(&self, u: FakeUser) {
        self.fake.lock().unwrap().users.insert(u.pk, u);
    }

    fn active(&self, pk: i64) -> bool {
        self.fake.lock().unwrap().users[&pk].is_active
    }

    /// Gives `user` an association under `account` on the simulated cluster.
    async fn assoc(&self, account: &str, user: &str) {
        let t = TenantRegistry::parse(TENANTS, "test").unwrap();
        let limits = specs::user_limits(&t.tenants[0]).unwrap();
        let account = onramp::domain::names::SlurmAccount::parse(account).unwrap();
        self.slurm.add_users(&account, &[Username::parse(user).unwrap()], true, &limits).await.unwrap();
    }

    async fn post(&self, token: &str, path: &str, body: &Value) -> (StatusCode, Value) {
        let r = self.http.post(format!("{}{path}", self.base)).bearer_auth(token).json(body).send().await.unwrap();
        (r.status(), r.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, token: &str, path: &str) -> (StatusCode, String) {
        let r = self.http.get(format!("{}{path}", self.base)).bearer_auth(token).send().await.unwrap();
        (r.status(), r.text().await.unwrap())
    }

    async fn jobs(&self) -> i64 {
        sqlx::query_scalar("select count(*) from jobs").fetch_one(self.engine.pool()).await.unwrap()
    }
}

fn offboard(tenant: &str, user: &str) -> Value {
    json!({"kind": "user.offboard", "tenant": tenant, "username": user})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_offboards_only_a_user_of_the_tenant_and_hard_cutoffs_need_an_admin() {
    let db = TestDb::new().await;
    let s = site(&db, false).await;
    s.user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    s.user(FakeUser::new(2, "bob", &["tenant-foo-users", "tenant-foo-ml"]));
    s.user(FakeUser::new(3, "carol", &["tenant-bar-users"]));
    s.user(FakeUser::new(4, "akadmin", &["authentik Admins"]));
    let ops = token(&s.engine, "ops", Role::Operator, None).await;
    let foo_ops = token(&s.engine, "foo-ops", Role::Operator, Some("foo")).await;
    let admin = token(&s.engine, "admin", Role::Admin, None).await;

    // Authentik's administrator, system accounts, another tenant's user: 422, and no job
    for (token, tenant, user) in [
        (&ops, "foo", "akadmin"),
        (&ops, "foo", "root"),
        (&ops, "bar", "slurm"),
        (&admin, "foo", "akadmin"),
        (&foo_ops, "foo", "carol"),
        (&foo_ops, "foo", "nobody"),
    ] {
        let (status, p) = s.post(token, "/v1/jobs", &offboard(tenant, user)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{user} in {tenant}: {p}");
        // system accounts are refused by name, before anyone is looked up
        let want = match user {
            "akadmin" | "root" | "slurm" | "nobody" => format!("{user} is a reserved system name"),
            _ => format!("{user} is not a user of tenant {tenant}"),
        };
        assert!(p["detail"].as_str().unwrap().contains(&want), "{p}");
    }
    assert_eq!(s.jobs().await, 0, "nothing was enqueued");
    // and another tenant's user is not the scoped operator's to name at all
    assert_eq!(s.post(&foo_ops, "/v1/jobs", &offboard("bar", "carol")).await.0, StatusCode::FORBIDDEN);

    // a member now (per Authentik) is offboarded; a former one known from the job history too
    let (status, job) = s.post(&foo_ops, "/v1/jobs", &offboard("foo", "alice")).await;
    assert_eq!((status, job["subject"].as_str()), (StatusCode::ACCEPTED, Some("foo/alice")), "{job}");
    let onboarded = onramp::flows::user_onboard::Input {
        tenant: "foo".into(),
        account: "tenant-foo".into(),
        username: "dave".into(),
        ..Default::default()
    };
    let earlier = s.engine.enqueue(&[onboarded.job(Actor::reconciler())]).await.unwrap()[0].id;
    // an onboarding that never got as far as the association proves nothing
    assert_eq!(s.post(&ops, "/v1/jobs", &offboard("foo", "dave")).await.0, StatusCode::UNPROCESSABLE_ENTITY);
    sqlx::query("update jobs set queue_state = 'succeeded', finished_at = now() where id = $1")
        .bind(earlier)
        .execute(s.engine.pool())
        .await
        .unwrap();
    assert_eq!(s.post(&ops, "/v1/jobs", &offboard("foo", "dave")).await.0, StatusCode::ACCEPTED);

    // a hard cutoff and a tenant offboarding: the admin role only
    let hard = json!({"kind": "user.offboard", "tenant": "foo", "username": "bob", "hard_cutoff": true});
    let (status, p) = s.post(&ops, "/v1/jobs", &hard).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("a hard cutoff needs the admin role"), "{p}");
    let tenant = json!({"kind": "tenant.offboard", "tenant": "bar"});
    let (status, p) = s.post(&foo_ops, "/v1/jobs", &json!({"kind": "tenant.offboard", "tenant": "foo"})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{p}");
    assert_eq!(s.post(&ops, "/v1/jobs", &tenant).await.0, StatusCode::FORBIDDEN);
    assert_eq!(s.post(&admin, "/v1/jobs", &hard).await.0, StatusCode::ACCEPTED);
    assert_eq!(s.post(&admin, "/v1/jobs", &tenant).await.0, StatusCode::ACCEPTED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_flow_refuses_a_user_without_an_association_and_deactivates_no_one_still_in_a_tenant() {
    let db = TestDb::new().await;
    let s = site(&db, true).await;
    s.user(FakeUser::new(4, "akadmin", &["authentik Admins"]));
    s.user(FakeUser::new(5, "erin", &["tenant-bar-users"]));
    s.user(FakeUser::new(6, "frank", &[]));
    s.assoc("tenant-foo", "erin").await;
    s.assoc("tenant-bar", "erin").await;
    s.assoc("tenant-foo", "frank").await;
    // as a reconcile (or anything past the API) would enqueue them
    let job = |user: &str| {
        let input = user_offboard::Input {
            tenant: "foo".into(),
            account: "tenant-foo".into(),
            username: user.into(),
            ..Default::default()
        };
        input.job(Actor::reconciler())
    };

    // no association under the tenant's account: the first step refuses, nothing is changed
    let mark = s.log.len();
    let id = s.engine.enqueue(&[job("akadmin")]).await.unwrap()[0].id;
    let failed = wait_state(&s.engine, id, "failed", T).await;
    assert_eq!(failed.step, "block");
    let why = failed.last_error.unwrap_or_default();
    assert!(why.contains("refused: akadmin has no association under account tenant-foo"), "{why}");
    let writes: Vec<String> = s.log.since(mark).iter().filter(|e| e.write).map(|e| e.call.clone()).collect();
    assert!(writes.is_empty(), "{writes:?}");
    assert!(s.active(4), "akadmin stays active");

    // still in another tenant's group: blocked here, the Authentik account left active
    let id = s.engine.enqueue(&[job("erin")]).await.unwrap()[0].id;
    let j = wait_state(&s.engine, id, "waiting", T).await;
    assert_eq!(j.step, "retention");
    assert_eq!(j.outputs["disable_login"]["authentik"], "left active: still a member of another tenant");
    assert!(s.active(5), "erin stays active: she is still in tenant bar");
    let erin = s.slurm.user(&Username::parse("erin").unwrap()).await.unwrap().unwrap();
    let bar = erin.assocs.iter().find(|a| a.account == "tenant-bar").unwrap();
    assert!(!bar.is_blocked(), "her association in bar is left alone");

    // in no tenant's group any more: deactivated
    let id = s.engine.enqueue(&[job("frank")]).await.unwrap()[0].id;
    let j = wait_state(&s.engine, id, "waiting", T).await;
    assert_eq!(j.outputs["disable_login"]["authentik"], "deactivated");
    assert!(!s.active(6));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_offboarding_needs_a_second_persons_approval() {
    let db = TestDb::new().await;
    let s = site(&db, true).await;
    let first = token(&s.engine, "first-admin", Role::Admin, None).await;
    let second = token(&s.engine, "second-admin", Role::Admin, None).await;
    let mark = s.log.len();
    let (status, job) = s.post(&first, "/v1/jobs", &json!({"kind": "tenant.offboard", "tenant": "bar"})).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    let id = job["id"].as_i64().unwrap();
    let waiting = wait_state(&s.engine, id, "needs_approval", T).await;
    assert_eq!(waiting.step, "confirm");
    assert!(s.log.since(mark).iter().all(|e| !e.write), "nothing changes before the approval");

    // the token that started it cannot approve it
    let (status, p) = s.post(&first, &format!("/v1/jobs/{id}/approve"), &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{p}");
    assert!(p["detail"].as_str().unwrap().starts_with("four eyes:"), "{p}");
    assert_eq!(s.engine.job(id).await.unwrap().state, JobState::NeedsApproval);
    // nor an operator: what it releases is irreversible (the dashboard shows Approve to admins only)
    let ops = token(&s.engine, "tenant-ops", Role::Operator, None).await;
    let (status, p) = s.post(&ops, &format!("/v1/jobs/{id}/approve"), &json!({})).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("needs an admin token"), "{p}");
    // nor can the command line as the same actor; another admin can
    let e = s.engine.approve(id, &Actor::api("first-admin")).await.unwrap_err();
    assert!(e.to_string().starts_with("four eyes:"), "{e}");
    let (status, j) = s.post(&second, &format!("/v1/jobs/{id}/approve"), &json!({})).await;
    assert_eq!(status, StatusCode::OK, "{j}");
    let j = eventually(T, "the offboarding to pass its confirmation", || async {
        let j = s.engine.job(id).await.unwrap();
        (j.step != "confirm").then_some(j)
    })
    .await;
    assert_eq!(j.outputs["confirm"]["approved_by"], "api:second-admin");
    // the audit trail names both
    let events = s.engine.events(id).await.unwrap();
    let approval = events.iter().find(|e| e.to_state == JobState::Pending && e.actor == "api:second-admin").unwrap();
    let detail = approval.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("four eyes: the job was started by api:first-admin"), "{detail}");
}

/// Asks for approval at its only step; wrapped in `FourEyes` as the brake's release is.
struct Release;

impl Flow for Release {
    fn kind(&self) -> &'static str {
        "test.release"
    }
    fn steps(&self) -> &'static [&'static str] {
        &["release"]
    }
    fn run<'a>(&'a self, _: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        let t = match &ctx.approved_by {
            Some(by) => Transition::Done(json!({ "released_by": by })),
            None => Transition::NeedsApproval("release the held offboardings".into()),
        };
        Box::pin(async move { t })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_four_eyes_flow_refuses_its_starters_approval_in_the_engine() {
    let db = TestDb::new().await;
    let engine = engine(&db, onramp::engine::Registry::new().with(FourEyes(Release)));
    let _w = TestWorker::start(&engine, worker_config("four-eyes", Duration::from_secs(10)));
    let starter = Actor::cli("alice");
    let id = engine.enqueue(&[NewJob::new("test.release", "x/1", json!({}), starter.clone())]).await.unwrap()[0].id;
    wait_state(&engine, id, "needs_approval", T).await;
    let e = engine.approve(id, &starter).await.unwrap_err();
    assert!(e.to_string().starts_with("four eyes: job"), "{e}");
    engine.approve(id, &Actor::cli("bob")).await.unwrap();
    let j = wait_state(&engine, id, "succeeded", T).await;
    assert_eq!(j.outputs["release"]["released_by"], "cli:bob");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scoped_token_plans_only_for_its_tenants_users() {
    let db = TestDb::new().await;
    let s = site(&db, false).await;
    s.user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    let mut carol = FakeUser::new(3, "carol", &["tenant-bar-users", "secret-project"]);
    carol.email = Some("carol.private@bar.example".into());
    s.user(carol);
    let foo = token(&s.engine, "foo-viewer", Role::Viewer, Some("foo")).await;
    let all = token(&s.engine, "viewer", Role::Viewer, None).await;

    let (status, body) = s.get(&foo, "/v1/plans/user.onboard?tenant=foo&user=alice").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // another tenant's user and nobody at all: the same answer, nothing about them
    for user in ["carol", "nosuchuser"] {
        for flow in ["user.onboard", "user.offboard"] {
            let (status, body) = s.get(&foo, &format!("/v1/plans/{flow}?tenant=foo&user={user}")).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{flow} {user}: {body}");
            let p: Value = serde_json::from_str(&body).unwrap();
            assert_eq!(p["detail"], format!("no user {user} in tenant foo"));
            for secret in ["carol.private", "bar.example", "secret-project", "tenant-bar"] {
                assert!(!body.contains(secret), "{body}");
            }
        }
    }
    // an unscoped token plans for anyone, as before
    let (status, body) = s.get(&all, "/v1/plans/user.onboard?tenant=foo&user=carol").await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_for_registry_tenants_and_the_reconcilers_jobs_for_unscoped_tokens() {
    let db = TestDb::new().await;
    let s = site(&db, false).await;
    let admin = token(&s.engine, "admin", Role::Admin, None).await;
    for tenant in ["reconcile", "nope"] {
        let (status, p) = s.post(&admin, "/v1/tokens", &json!({"name": "x", "role": "viewer", "tenant": tenant})).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{p}");
        assert_eq!(p["detail"], format!("tenant {tenant} is not in the tenant registry"));
    }
    let (status, p) = s.post(&admin, "/v1/tokens", &json!({"name": "x", "role": "viewer", "tenant": "foo"})).await;
    assert_eq!(status, StatusCode::CREATED, "{p}");
    // the command line checks the same, against ONRAMP_TENANTS
    let dir = std::env::temp_dir().join(format!("onramp-authority-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("tenants.yaml"), TENANTS).unwrap();
    let cli = |tenant: &str, tenants: Option<std::path::PathBuf>| onramp::app::cli::TokenArgs {
        db: onramp::app::cli::DbArgs {
            database_url: onramp::domain::secret::Secret::new(db.url.clone()),
            db_pool_size: 2,
        },
        tenants,
        action: onramp::app::cli::TokenAction::Create {
            name: format!("cli-{tenant}"),
            role: "viewer".into(),
            tenant: Some(tenant.into()),
            expires: None,
        },
    };
    let e = onramp::app::admin::tokens(cli("reconcile", Some(dir.join("tenants.yaml")))).await.unwrap_err();
    assert_eq!(e.to_string(), "tenant reconcile is not in the tenant registry");
    let e = onramp::app::admin::tokens(cli("foo", None)).await.unwrap_err();
    assert!(e.to_string().contains("ONRAMP_TENANTS"), "{e}");
    onramp::app::admin::tokens(cli("foo", Some(dir.join("tenants.yaml")))).await.unwrap();
    std::fs::remove_dir_all(&dir).unwrap();

    // the reconciler's jobs list every tenant's users: unscoped tokens only, even for a token
    // made for "reconcile" before tenants were checked
    let later = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let full = onramp::flows::reconcile::full_job(Actor::reconciler(), "test").at(later);
    let one = onramp::flows::reconcile::tenant_job("foo", Actor::reconciler(), "test").at(later);
    let mine = NewJob::new("user.onboard", "foo/alice", json!({}), Actor::cli("t")).at(later);
    let ids: Vec<i64> = s.engine.enqueue(&[full, one, mine]).await.unwrap().iter().map(|e| e.id).collect();
    let legacy = token(&s.engine, "legacy", Role::Admin, Some("reconcile")).await;
    let foo = token(&s.engine, "foo", Role::Viewer, Some("foo")).await;
    let listed = |body: String| -> Vec<i64> {
        let v: Value = serde_json::from_str(&body).unwrap();
        v["jobs"].as_array().unwrap().iter().map(|j| j["id"].as_i64().unwrap()).collect()
    };
    assert_eq!(listed(s.get(&legacy, "/v1/jobs").await.1), Vec::<i64>::new());
    assert_eq!(listed(s.get(&legacy, "/v1/jobs?tenant=reconcile").await.1), Vec::<i64>::new());
    assert_eq!(listed(s.get(&foo, "/v1/jobs").await.1), vec![ids[2]]);
    assert_eq!(listed(s.get(&admin, "/v1/jobs").await.1).len(), 3);
    for id in &ids[..2] {
        assert_eq!(s.get(&legacy, &format!("/v1/jobs/{id}")).await.0, StatusCode::NOT_FOUND);
        assert_eq!(s.get(&foo, &format!("/v1/jobs/{id}")).await.0, StatusCode::NOT_FOUND);
        assert_eq!(s.post(&legacy, &format!("/v1/jobs/{id}/cancel"), &json!({})).await.0, StatusCode::NOT_FOUND);
        assert_eq!(s.get(&admin, &format!("/v1/jobs/{id}")).await.0, StatusCode::OK);
    }
}

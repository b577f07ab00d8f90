//! The portal's side of the API: starting work (POST /v1/jobs) with its checks and
//! Idempotency-Key, the tenants overview and the drift report, against the intake harness (a fake
//! Authentik and a fake association source; user and tenant flows stand in and wait for approval).

use std::time::Duration;

use onramp::domain::names::{SlurmAccount, TenantName, Username};
use onramp::engine::Actor;
use onramp::flows::reconcile::plan::{Action, Op};
use onramp::http::access::Role;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::common::*;
use crate::http_api::token;
use crate::intake_support::{App, AppOptions, FakeUser, app};

async fn post(
    a: &App,
    token: &str,
    key: Option<&str>,
    body: &Value,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let mut req = a.http.post(format!("{}/v1/jobs", a.base)).bearer_auth(token).json(body);
    if let Some(k) = key {
        req = req.header("Idempotency-Key", k);
    }
    let r = req.send().await.unwrap();
    let (status, headers) = (r.status(), r.headers().clone());
    (status, headers, r.json().await.unwrap_or(Value::Null))
}

async fn get(a: &App, token: &str, path: &str) -> (StatusCode, Value) {
    let r = a.http.get(format!("{}{path}", a.base)).bearer_auth(token).send().await.unwrap();
    (r.status(), r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_work_is_checked_and_an_idempotency_key_answers_the_same_job() {
    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    // onboarding is refused at once for anyone Authentik does not place in the tenant
    a.add_user(FakeUser::new(7, "alice", &["tenant-foo-users", "tenant-foo-ml"]));
    a.add_user(FakeUser::new(8, "bob", &["tenant-foo-users"]));
    a.add_user(FakeUser::new(9, "zoe", &["tenant-foo-users"]));
    let ops = token(&a.engine, "portal", Role::Operator, None).await;
    let onboard = json!({"kind": "user.onboard", "tenant": "foo", "account": "ml-team-foo", "username": "alice"});

    let (status, headers, job) = post(&a, &ops, Some("k1"), &onboard).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{job}");
    let id = job["id"].as_i64().unwrap();
    assert_eq!(headers["location"], format!("/v1/jobs/{id}").as_str());
    assert_eq!((job["kind"].as_str(), job["subject"].as_str()), (Some("user.onboard"), Some("foo/alice")));
    assert_eq!(job["dedupe_key"], "user.onboard:ml-team-foo/alice");
    assert_eq!(
        (job["input"]["account"].as_str(), job["created_by"].as_str()),
        (Some("ml-team-foo"), Some("api:portal"))
    );

    // the same key and request: the same job, 200
    let (status, headers, again) = post(&a, &ops, Some("k1"), &onboard).await;
    assert_eq!((status, again["id"].as_i64()), (StatusCode::OK, Some(id)));
    assert_eq!(headers["idempotent-replayed"], "true");
    // the same key with another request: 422
    let other = json!({"kind": "user.onboard", "tenant": "foo", "username": "bob"});
    let (status, _, p) = post(&a, &ops, Some("k1"), &other).await;
    assert_eq!(
        (status, p["type"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("urn:onramp:problem:idempotency-key-reused"))
    );
    // no key: the unfinished job doing the same work
    let (status, _, same) = post(&a, &ops, None, &onboard).await;
    assert_eq!((status, same["id"].as_i64()), (StatusCode::OK, Some(id)));

    // a webhook-driven reconcile and the portal dedupe to one job
    let action = Action {
        op: Op::Offboard,
        tenant: TenantName::parse("foo").unwrap(),
        account: SlurmAccount::parse("tenant-foo").unwrap(),
        username: Username::parse("carol").unwrap(),
        member: None,
        reason: "test".into(),
    };
    let by_reconcile = a.engine.enqueue(&[onramp::flows::reconcile::job_for(&action, "webhook:x")]).await.unwrap()[0];
    // (a hard cutoff and a tenant offboarding need the admin role)
    let admin = token(&a.engine, "portal-admin", Role::Admin, None).await;
    let offboard = json!({"kind": "user.offboard", "tenant": "foo", "username": "carol", "hard_cutoff": true});
    let (status, _, job) = post(&a, &admin, None, &offboard).await;
    assert_eq!((status, job["id"].as_i64()), (StatusCode::OK, Some(by_reconcile.id)));

    // concurrent requests with one key: one job, one key, no error
    let bulk = json!({"kind": "tenant.offboard", "tenant": "bar", "hard_cutoff": true});
    let answers = futures_util::future::join_all((0..8).map(|_| post(&a, &admin, Some("k2"), &bulk))).await;
    let statuses: Vec<u16> = answers.iter().map(|(s, _, _)| s.as_u16()).collect();
    assert_eq!(statuses.iter().filter(|s| **s == 202).count(), 1, "{statuses:?}");
    assert!(statuses.iter().all(|s| [200, 202].contains(s)), "{statuses:?}");
    let ids: std::collections::BTreeSet<i64> = answers.iter().map(|(_, _, j)| j["id"].as_i64().unwrap()).collect();
    assert_eq!(ids.len(), 1);
    let bulk_id = *ids.first().unwrap();
    assert_eq!(answers[0].2["input"]["hard_cutoff"], true);
    // the key outlives its job: after the job is closed, the key still answers that job
    a.engine.cancel(bulk_id, &Actor::cli("test"), Some("test")).await.unwrap();
    let (status, _, job) = post(&a, &admin, Some("k2"), &bulk).await;
    assert_eq!((status, job["id"].as_i64(), job["state"].as_str()), (StatusCode::OK, Some(bulk_id), Some("cancelled")));
    // a new key starts the work again
    let (status, _, job) = post(&a, &admin, Some("k3"), &bulk).await;
    assert_eq!(status, StatusCode::ACCEPTED);
    assert_ne!(job["id"].as_i64(), Some(bulk_id));
    let keys: i64 = sqlx::query_scalar("select count(*) from idempotency_keys").fetch_one(&db.pool).await.unwrap();
    assert_eq!(keys, 3);
    // a day later a key is forgotten: k2 may start other work, and expired keys are cleaned up
    sqlx::query("update idempotency_keys set created_at = created_at - interval '25 hours'")
        .execute(&db.pool)
        .await
        .unwrap();
    let other = json!({"kind": "user.onboard", "tenant": "foo", "username": "zoe"});
    let (status, _, job) = post(&a, &admin, Some("k2"), &other).await;
    assert_eq!((status, job["kind"].as_str()), (StatusCode::ACCEPTED, Some("user.onboard")), "{job}");
    let (status, _, again) = post(&a, &admin, Some("k2"), &other).await;
    assert_eq!((status, again["id"].as_i64()), (StatusCode::OK, job["id"].as_i64()));
    let keys: Vec<String> =
        sqlx::query_scalar("select key from idempotency_keys order by key").fetch_all(&db.pool).await.unwrap();
    assert_eq!(keys, ["k2"], "the other expired keys are gone");

    // checks: 422 with a message that names the mistake
    for (body, says) in [
        (
            json!({"kind": "user.onboard", "tenant": "nope", "username": "alice"}),
            "tenant nope is not in the tenant registry",
        ),
        (
            json!({"kind": "user.onboard", "tenant": "foo", "account": "ml-team-bar", "username": "alice"}),
            "not one of tenant foo's accounts",
        ),
        (
            json!({"kind": "user.onboard", "tenant": "foo", "username": "Alice;rm"}),
            "username \"Alice;rm\" is not allowed",
        ),
        (json!({"kind": "user.onboard", "tenant": "Foo", "username": "alice"}), "is not allowed"),
        (json!({"kind": "user.onboard", "tenant": "foo", "username": "alice", "admin": true}), "unknown field `admin`"),
        (json!({"kind": "selftest"}), "unknown variant `selftest`"),
        (json!({"kind": "tenant.onboard"}), "missing field `tenant`"),
    ] {
        let (status, _, p) = post(&a, &ops, None, &body).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(says), "{body}: {p}");
    }
    let r = a.http.post(format!("{}/v1/jobs", a.base)).bearer_auth(&ops).body("{").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let r = a
        .http
        .post(format!("{}/v1/jobs", a.base))
        .bearer_auth(&ops)
        .header("content-type", "application/json")
        .body("{")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);

    // roles and tenant scope
    let viewer = token(&a.engine, "viewer", Role::Viewer, None).await;
    assert_eq!(post(&a, &viewer, None, &onboard).await.0, StatusCode::FORBIDDEN);
    let bar = token(&a.engine, "bar-ops", Role::Operator, Some("bar")).await;
    let (status, _, p) = post(&a, &bar, None, &onboard).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("tenant bar only"), "{p}");
    assert_eq!(post(&a, &bar, None, &json!({"kind": "reconcile.full"})).await.0, StatusCode::FORBIDDEN);
    assert_eq!(post(&a, &bar, None, &json!({"kind": "tenant.onboard", "tenant": "bar"})).await.0, StatusCode::ACCEPTED);
    let (status, _, job) = post(&a, &ops, None, &json!({"kind": "reconcile.full"})).await;
    assert_eq!((status, job["kind"].as_str()), (StatusCode::ACCEPTED, Some("reconcile.full")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_and_drift_come_from_the_latest_reconcile() {
    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    let ops = token(&a.engine, "ops", Role::Operator, None).await;
    let bar = token(&a.engine, "bar-viewer", Role::Viewer, Some("bar")).await;
    a.add_user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    a.add_user(FakeUser::new(2, "bob", &["tenant-foo-users", "tenant-foo-ml"]));
    a.cluster.set(&[("tenant-foo", "alice"), ("tenant-foo", "carol")]);

    // before any reconcile: the registry's figures, no measurements
    let (status, body) = get(&a, &ops, "/v1/tenants").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let foo = &body["tenants"][0];
    assert_eq!(
        (foo["name"].as_str(), foo["members"].clone(), foo["drift"].clone()),
        (Some("foo"), Value::Null, Value::Null)
    );
    assert_eq!(foo["teams"][0]["account"], "ml-team-foo");
    assert_eq!(foo["user_defaults"]["max_jobs"], 20);
    // the Kubernetes names onramp uses for it: the runbook's
    let k = &foo["kubernetes"];
    assert_eq!(
        (k["namespace"].as_str(), k["keys_secret"].as_str()),
        (Some("tenant-foo"), Some("tenant-foo-authorized-keys"))
    );
    assert_eq!(
        (k["slurm_cluster"].as_str(), k["reservation"].as_str()),
        (Some("cluster-tenant-foo"), Some("tenant-foo-reservation"))
    );
    assert_eq!((k["node_label"].as_str(), k["login_pod"].as_str()), (Some("tenant-foo"), Some("login-0")));
    assert_eq!(get(&a, &ops, "/v1/drift").await.0, StatusCode::NOT_FOUND);

    let w = TestWorker::start(&a.engine, worker_config("w1", Duration::from_secs(5)));
    let (_, _, job) = post(&a, &ops, None, &json!({"kind": "reconcile.full"})).await;
    let id = job["id"].as_i64().unwrap();
    wait_state(&a.engine, id, "succeeded", Duration::from_secs(20)).await;
    // the onboarding (bob) and offboarding (carol) it started stand in: they wait for approval
    eventually(Duration::from_secs(20), "the user jobs to wait for approval", || async {
        let n: i64 =
            sqlx::query_scalar("select count(*) from jobs where kind like 'user.%' and state = 'needs_approval'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        (n == 2).then_some(())
    })
    .await;
    w.shutdown().await;

    let (_, foo) = get(&a, &ops, "/v1/tenants/foo").await;
    let m = &foo["members"];
    assert_eq!(
        (m["members"].as_u64(), m["associations"].as_u64(), m["job"].as_i64()),
        (Some(2), Some(2), Some(id)),
        "{foo}"
    );
    assert_eq!(m["groups"]["tenant-foo-ml"], 1);
    assert_eq!(m["by_account"]["tenant-foo"], 2);
    assert!(m["measured_at"].is_string());
    let d = &foo["drift"];
    assert_eq!(
        (d["onboard"].as_u64(), d["offboard"].as_u64(), d["decision"].as_str()),
        (Some(1), Some(1), Some("changes")),
        "{foo}"
    );
    let f = &foo["jobs_in_flight"];
    assert_eq!((f["total"].as_i64(), f["needs_attention"].as_i64()), (Some(2), Some(2)), "{foo}");
    assert_eq!((f["by_kind"]["user.onboard"].as_i64(), f["by_kind"]["user.offboard"].as_i64()), (Some(1), Some(1)));

    let (status, drift) = get(&a, &ops, "/v1/drift").await;
    assert_eq!((status, drift["job"].as_i64()), (StatusCode::OK, Some(id)), "{drift}");
    assert_eq!(drift["report"]["tenants"].as_array().unwrap().len(), 2);
    assert_eq!(drift["cause"], "api:ops");

    // a tenant-scoped token sees its own tenant only
    let (_, body) = get(&a, &bar, "/v1/tenants").await;
    let names: Vec<&str> = body["tenants"].as_array().unwrap().iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["bar"]);
    assert_eq!(get(&a, &bar, "/v1/tenants/foo").await.0, StatusCode::NOT_FOUND);
    let (_, drift) = get(&a, &bar, "/v1/drift").await;
    let tenants: Vec<&str> =
        drift["report"]["tenants"].as_array().unwrap().iter().map(|t| t["tenant"].as_str().unwrap()).collect();
    assert_eq!(tenants, ["bar"]);
    assert_eq!(get(&a, &ops, "/v1/tenants/nope").await.0, StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_tenant_registry_starting_work_and_tenants_answer_503() {
    let db = TestDb::new().await;
    let engine = engine(&db, onramp::flows::registry());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let (e, s) = (engine.clone(), stop.clone());
    tokio::spawn(async move { onramp::app::world::World::bare(e).run(Some(listener), None, s).await.unwrap() });
    let admin = token(&engine, "admin", Role::Admin, None).await;
    let http = reqwest::Client::new();
    let r = http
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(&admin)
        .json(&json!({"kind": "reconcile.full"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert!(p["detail"].as_str().unwrap().contains("ONRAMP_TENANTS"), "{p}");
    let r = http.get(format!("{base}/v1/tenants")).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let r = http.get(format!("{base}/v1/drift")).bearer_auth(&admin).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_lists_a_flows_calls_in_order_and_changes_nothing() {
    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    let mut alice = FakeUser::new(7, "alice", &["tenant-foo-users", "tenant-foo-ml"]);
    alice.attributes = json!({ "sshPublicKey": crate::flows_support::KEY });
    a.fake.lock().unwrap().users.insert(7, alice);
    let viewer = token(&a.engine, "viewer", Role::Viewer, None).await;

    let (status, plan) = get(&a, &viewer, "/v1/plans/user.onboard?tenant=foo&user=alice").await;
    assert_eq!(status, StatusCode::OK, "{plan}");
    assert_eq!(plan["stopped"], Value::Null, "{plan}");
    assert_eq!(plan["input"]["account"], "ml-team-foo", "placed by her Authentik groups");
    let steps: Vec<&str> = plan["steps"].as_array().unwrap().iter().map(|s| s["step"].as_str().unwrap()).collect();
    let at = |s: &str| steps.iter().position(|x| *x == s).unwrap_or_else(|| panic!("{s}: {steps:?}"));
    assert!(at("propagation_wait") < at("slurm_association") && at("slurm_association") < at("smoke_test"));
    let writes: Vec<String> = plan["steps"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| s["effects"].as_array().unwrap().clone())
        .filter(|e| e["write"] == true)
        .map(|e| e["call"].as_str().unwrap().to_string())
        .collect();
    assert!(writes.iter().any(|c| c.starts_with("sacctmgr -i add user alice Account=ml-team-foo")), "{writes:?}");
    assert!(writes.iter().any(|c| c.starts_with("mkdir -m 700 -- /home/.onramp-new-alice")), "{writes:?}");
    // Authentik was only read; no job was made
    assert!(a.fake.lock().unwrap().users[&7].is_active);
    let (_, jobs) = get(&a, &viewer, "/v1/jobs").await;
    assert_eq!(jobs["jobs"].as_array().unwrap().len(), 0);

    let bar = token(&a.engine, "bar", Role::Admin, Some("bar")).await;
    assert_eq!(get(&a, &bar, "/v1/plans/user.onboard?tenant=foo&user=alice").await.0, StatusCode::FORBIDDEN);
    for (path, says) in [
        ("/v1/plans/user.dance?tenant=foo&user=alice", "no plan for flow"),
        ("/v1/plans/user.onboard?tenant=foo", "needs a user"),
        ("/v1/plans/tenant.onboard?tenant=nope", "not in the tenant registry"),
        ("/v1/plans/user.onboard?tenant=foo&user=Bad%3BName", "user:"),
    ] {
        let (status, p) = get(&a, &viewer, path).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{path}: {p}");
        assert!(p["detail"].as_str().unwrap().contains(says), "{path}: {p}");
    }
}

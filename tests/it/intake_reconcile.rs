//! Webhook → reconcile → the right onboarding/offboarding job, against a fake Authentik API and a
//! fake association source; the safety brake; the API client's paging, retries and errors.

use std::time::Duration;

use onramp::backends::authentik::AuthentikError;
use serde_json::{Value, json};

use crate::common::{TestDb, TestWorker, eventually, wait_state, worker_config};
use crate::intake_support::*;

async fn finished(app: &App, kind: &str, n: usize) -> Vec<Value> {
    eventually(Duration::from_secs(20), &format!("{n} {kind} jobs to finish"), || async {
        let rows: Vec<(String, Value)> = sqlx::query_as("select state, outputs from jobs where kind = $1 order by id")
            .bind(kind)
            .fetch_all(app.engine.pool())
            .await
            .unwrap();
        let done: Vec<Value> =
            rows.iter().filter(|(s, _)| s == "succeeded").map(|(_, o)| o["reconcile"].clone()).collect();
        (rows.len() >= n && done.len() == rows.len()).then_some(done)
    })
    .await
}

fn pairs(jobs: &[(i64, String, Option<String>, Value)]) -> Vec<String> {
    let mut v: Vec<String> = jobs.iter().map(|j| j.2.clone().unwrap_or_default()).collect();
    v.sort();
    v
}

#[tokio::test]
async fn user_added_to_the_tenant_group_is_onboarded_once() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let mut alice = FakeUser::new(42, "alice", &["tenant-foo-users"]);
    alice.attributes = json!({"sshPublicKey": "ssh-ed25519 AAAA alice@laptop"});
    app.add_user(alice);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let body = structured("a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1a1", "model_updated", user_model(42), None);
    assert_eq!(app.post_signed(&body, None).await.status().as_u16(), 202);
    let out = finished(&app, "reconcile.user", 1).await;
    assert_eq!(out[0]["decision"], "onboard", "{}", out[0]);
    let jobs = app.jobs("user.onboard").await;
    assert_eq!(pairs(&jobs), ["user.onboard:tenant-foo/alice"]);
    let input = &jobs[0].3;
    assert_eq!(
        (input["tenant"].as_str(), input["username"].as_str(), input["uid_number"].as_u64()),
        (Some("foo"), Some("alice"), Some(4042))
    );
    // another event for the same user while onboarding is under way: no second job
    let body = structured("a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2a2", "model_updated", user_model(42), None);
    assert_eq!(app.post_signed(&body, None).await.status().as_u16(), 202);
    let out = finished(&app, "reconcile.user", 2).await;
    assert_eq!(out[1]["jobs"][0]["new"], false, "{}", out[1]);
    assert_eq!(app.jobs("user.onboard").await.len(), 1);
    w.shutdown().await;
}

#[tokio::test]
async fn user_removed_from_the_group_is_offboarded_and_unchanged_users_are_left_alone() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    app.add_user(FakeUser::new(42, "alice", &[]));
    app.add_user(FakeUser::new(43, "bob", &["tenant-foo-users"]));
    app.cluster.set(&[("tenant-foo", "alice"), ("tenant-foo", "bob")]);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    for (uuid, pk) in [("b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1b1", 42), ("b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2b2", 43)] {
        assert_eq!(
            app.post_signed(&structured(uuid, "model_updated", user_model(pk), None), None).await.status().as_u16(),
            202
        );
    }
    let out = finished(&app, "reconcile.user", 2).await;
    let decisions: Vec<&str> = out.iter().map(|o| o["decision"].as_str().unwrap()).collect();
    assert_eq!(decisions, ["offboard", "nothing"]);
    assert!(out[0]["reason"].as_str().unwrap().contains("not in a group"), "{}", out[0]);
    assert_eq!(pairs(&app.jobs("user.offboard").await), ["user.offboard:tenant-foo/alice"]);
    assert!(app.jobs("user.onboard").await.is_empty());
    w.shutdown().await;
}

#[tokio::test]
async fn a_full_reconcile_onboards_again_the_members_whose_association_limits_drifted() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    app.add_user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    app.add_user(FakeUser::new(2, "bob", &["tenant-foo-users"]));
    app.add_user(FakeUser::new(3, "erin", &["tenant-bar-users"]));
    app.add_user(FakeUser::new(4, "frank", &["tenant-bar-users"]));
    app.cluster.set(&[("tenant-foo", "alice"), ("tenant-foo", "bob"), ("tenant-bar", "erin"), ("tenant-bar", "frank")]);
    // bob's MaxJobs was changed by hand; frank's association is blocked (an offboarding's block)
    app.cluster.drift("tenant-foo", "bob", "parent|||||7||normal|normal");
    app.cluster.drift("tenant-bar", "frank", "parent|0||||0|0||");
    app.engine
        .enqueue(&[onramp::flows::reconcile::full_job(onramp::engine::Actor::cli("test"), "test")])
        .await
        .unwrap();
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let out = finished(&app, "reconcile.full", 1).await;
    assert_eq!(
        pairs(&app.jobs("user.onboard").await),
        ["user.onboard:tenant-bar/frank", "user.onboard:tenant-foo/bob"]
    );
    assert!(app.jobs("user.offboard").await.is_empty());
    let foo = &out[0]["tenants"][0];
    assert_eq!((foo["tenant"].as_str(), foo["unchanged"].as_u64()), (Some("foo"), Some(1)), "{foo}");
    let why = foo["jobs"][0]["reason"].as_str().unwrap();
    assert!(why.contains("limits other than the tenant's: MaxJobs"), "{why}");
    let why = out[0]["tenants"][1]["jobs"][0]["reason"].as_str().unwrap();
    assert!(why.contains("MaxJobs, GrpJobs"), "{why}");
    w.shutdown().await;
}

#[tokio::test]
async fn deactivated_or_deleted_users_are_offboarded() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let mut carol = FakeUser::new(44, "carol", &["tenant-foo-users"]);
    carol.is_active = false;
    app.add_user(carol);
    app.cluster.set(&[("tenant-foo", "carol"), ("tenant-foo", "dave")]);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    app.post_signed(&structured("c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1c1", "model_updated", user_model(44), None), None).await;
    // dave (pk 45) was deleted: only his pk is known, so everything is looked at (brake applies)
    app.post_signed(&structured("c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2c2", "model_deleted", user_model(45), None), None).await;
    let out = finished(&app, "reconcile.user", 2).await;
    assert!(out[0]["reason"].as_str().unwrap().contains("deactivated"), "{}", out[0]);
    assert_eq!(out[1]["decision"], "full_reconcile");
    finished(&app, "reconcile.full", 1).await;
    assert_eq!(
        pairs(&app.jobs("user.offboard").await),
        ["user.offboard:tenant-foo/carol", "user.offboard:tenant-foo/dave"]
    );
    w.shutdown().await;
}

#[tokio::test]
async fn group_event_without_diff_reconciles_the_whole_group_and_with_diff_the_users() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    app.add_user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    app.add_user(FakeUser::new(2, "bob", &["tenant-foo-users", "tenant-foo-ml"]));
    app.add_user(FakeUser::new(3, "erin", &["tenant-bar-users"]));
    app.cluster.set(&[("tenant-foo", "alice"), ("tenant-foo", "carol")]);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let r = app
        .post_signed(
            &structured("d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1", "model_updated", group_model("tenant-foo-ml"), None),
            None,
        )
        .await;
    assert_eq!(r.status().as_u16(), 202);
    let out = finished(&app, "reconcile.tenant", 1).await;
    assert_eq!(out[0]["tenants"][0]["tenant"], "foo", "{}", out[0]);
    assert_eq!(pairs(&app.jobs("user.onboard").await), ["user.onboard:ml-team-foo/bob"]);
    assert_eq!(pairs(&app.jobs("user.offboard").await), ["user.offboard:tenant-foo/carol"]);
    // the other tenant is not touched by this group's event
    assert!(app.jobs("user.onboard").await.iter().all(|j| j.3["tenant"] == "foo"));

    // enterprise builds send the diff: only those users are looked at
    let diff = json!({"users": {"add": [3]}});
    let r = app
        .post_signed(
            &structured(
                "d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2",
                "model_updated",
                group_model("tenant-bar-users"),
                Some(diff),
            ),
            None,
        )
        .await;
    assert_eq!(r.status().as_u16(), 202);
    let out = finished(&app, "reconcile.user", 1).await;
    assert_eq!(out[0]["decision"], "onboard");
    assert!(pairs(&app.jobs("user.onboard").await).contains(&"user.onboard:tenant-bar/erin".to_string()));
    assert_eq!(app.jobs("reconcile.tenant").await.len(), 1);
    w.shutdown().await;
}

#[tokio::test]
async fn safety_brake_holds_when_authentik_returns_an_empty_group() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let users: Vec<String> = (0..20).map(|i| format!("user{i}")).collect();
    let assoc: Vec<(&str, &str)> = users.iter().map(|u| ("tenant-foo", u.as_str())).collect();
    app.cluster.set(&assoc);
    // tenant bar loses one of its two users: under the brake's threshold, it goes ahead
    app.add_user(FakeUser::new(99, "keeper", &["tenant-bar-users"]));
    let mut all = assoc.clone();
    all.extend([("tenant-bar", "keeper"), ("tenant-bar", "leaver")]);
    app.cluster.set(&all);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let id = app
        .engine
        .enqueue(&[onramp::flows::reconcile::full_job(onramp::engine::Actor::reconciler(), "test")])
        .await
        .unwrap()[0]
        .id;
    wait_state(&app.engine, id, "succeeded", Duration::from_secs(20)).await;
    let offboards = pairs(&app.jobs("user.offboard").await);
    assert_eq!(offboards, ["user.offboard:tenant-bar/leaver"]);
    let holds = app.jobs("reconcile.hold").await;
    assert_eq!(holds.len(), 1);
    let hold = wait_state(&app.engine, holds[0].0, "needs_approval", Duration::from_secs(20)).await;
    assert!(hold.last_error.as_deref().unwrap_or_default().contains("20 of 20"), "{hold:?}");
    // another pass while the hold waits: still nobody offboarded in foo, still one hold
    let id = app
        .engine
        .enqueue(&[onramp::flows::reconcile::full_job(onramp::engine::Actor::reconciler(), "test")])
        .await
        .unwrap()[0]
        .id;
    wait_state(&app.engine, id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(app.jobs("user.offboard").await.len(), 1);
    assert_eq!(app.jobs("reconcile.hold").await.len(), 1);

    // Authentik recovers for some; a person approves: only those still to go are offboarded
    app.add_user(FakeUser::new(1, "user0", &["tenant-foo-users"]));
    app.engine.approve(holds[0].0, &onramp::engine::Actor::cli("ops")).await.unwrap();
    wait_state(&app.engine, holds[0].0, "succeeded", Duration::from_secs(20)).await;
    let offboards = pairs(&app.jobs("user.offboard").await);
    assert_eq!(offboards.len(), 1 + 19, "{offboards:?}");
    assert!(!offboards.contains(&"user.offboard:tenant-foo/user0".to_string()));
    w.shutdown().await;
}

#[tokio::test]
async fn a_missing_group_offboards_nobody() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    app.fake.lock().unwrap().groups.retain(|g| g != "tenant-foo-ml");
    app.cluster.set(&[("tenant-foo", "alice")]);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let id = app
        .engine
        .enqueue(&[onramp::flows::reconcile::full_job(onramp::engine::Actor::reconciler(), "test")])
        .await
        .unwrap()[0]
        .id;
    let job = wait_state(&app.engine, id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(job.outputs["reconcile"]["tenants"][0]["decision"], "skipped", "{}", job.outputs);
    assert!(app.jobs("user.offboard").await.is_empty());
    w.shutdown().await;
}

#[tokio::test]
async fn api_client_pages_retries_and_types_its_errors() {
    let (fake, url) = fake_authentik().await;
    for pk in 1..=250 {
        let groups: &[&str] = if pk % 2 == 0 { &["tenant-foo-users"] } else { &["tenant-bar-users"] };
        fake.lock().unwrap().users.insert(pk, FakeUser::new(pk, &format!("u{pk}"), groups));
    }
    let c = client(&url);
    let members = c.active_members("tenant-foo-users").await.unwrap();
    assert_eq!(members.len(), 125);
    let pages = fake.lock().unwrap().requests.iter().filter(|r| r.contains("groups_by_name")).count();
    assert_eq!(pages, 2);

    // 503 with Retry-After, then 429: retried; the answer arrives
    fake.lock().unwrap().fail_next.extend([(503, Some(0)), (429, None)]);
    let u = c.user(4).await.unwrap();
    assert_eq!((u.username.as_str(), u.group_names()), ("u4", vec!["tenant-foo-users".to_string()]));

    // not found is an answer: one request, no retries
    let before = fake.lock().unwrap().requests.len();
    assert!(matches!(c.user(9999).await, Err(AuthentikError::NotFound(_))));
    assert_eq!(fake.lock().unwrap().requests.len(), before + 1);
    assert!(matches!(c.active_members("no-such-group").await, Err(AuthentikError::NotFound(_))));

    // persistent 5xx: Unavailable after the configured attempts, transient
    fake.lock().unwrap().fail_next.extend([(502, None), (502, None), (502, None)]);
    let e = c.user(4).await.unwrap_err();
    assert!(e.is_transient() && matches!(e, AuthentikError::Unavailable { attempts: 3, .. }), "{e}");

    let u = c.deactivate(4).await.unwrap();
    assert!(!u.is_active);
    assert_eq!(c.active_members("tenant-foo-users").await.unwrap().len(), 124);
    assert_eq!(c.user_by_username("u5").await.unwrap().pk, 5);

    let bad = onramp::backends::authentik::AuthentikClient::new(onramp::backends::authentik::AuthentikConfig {
        url: url.clone(),
        token: onramp::domain::secret::Secret::new("wrong"),
        timeout: Duration::from_secs(5),
        attempts: 3,
        backoff: Duration::from_millis(10),
        page_size: 100,
        concurrency: 32,
    })
    .unwrap();
    assert!(matches!(bad.user(4).await, Err(AuthentikError::Unauthorized(403))));
}

#[tokio::test]
async fn the_authentik_client_keeps_at_most_its_concurrency_of_requests_in_flight() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    #[derive(Default)]
    struct Seen {
        now: AtomicUsize,
        most: AtomicUsize,
    }
    let seen = Arc::new(Seen::default());
    let s = seen.clone();
    let app = axum::Router::new().route(
        "/api/v3/core/users/{pk}/",
        axum::routing::get(move |axum::extract::Path(pk): axum::extract::Path<i64>| {
            let s = s.clone();
            async move {
                let n = s.now.fetch_add(1, SeqCst) + 1;
                s.most.fetch_max(n, SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                s.now.fetch_sub(1, SeqCst);
                axum::Json(json!({"pk": pk, "username": format!("u{pk}"), "is_active": true}))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let c = onramp::backends::authentik::AuthentikClient::new(onramp::backends::authentik::AuthentikConfig {
        url,
        token: onramp::domain::secret::Secret::new(TOKEN),
        timeout: Duration::from_secs(5),
        attempts: 1,
        backoff: Duration::from_millis(10),
        page_size: 100,
        concurrency: 3,
    })
    .unwrap();
    let calls: Vec<_> = (1..=20i64).map(|pk| c.user(pk)).collect();
    let users = futures_util::future::join_all(calls).await;
    assert!(users.iter().all(Result::is_ok), "{:?}", users.iter().find(|u| u.is_err()));
    assert_eq!(seen.most.load(SeqCst), 3, "20 requests at once, at most 3 in flight");
}

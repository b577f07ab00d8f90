//! The one safety brake (issue #13, defect 2): a budget of offboardings per window across every
//! tenant, both reconcile paths (a tenant pass, a single user's reconcile) and every replica;
//! past it, offboardings are held for the one `reconcile.hold` job, whose approval releases those
//! still to be offboarded.

use std::time::Duration;

use onramp::engine::{Actor, Budget, Engine, Metered, NewJob, Registry, Through};
use onramp::flows::reconcile::hold::hold_job;
use onramp::flows::reconcile::{Brake, OFFBOARD_BUDGET, full_job, user_job};
use onramp::flows::user_offboard::USER_OFFBOARD;
use serde_json::{Value, json};

use crate::common::{TestDb, TestWorker, wait_state, worker_config};
use crate::intake_support::*;

/// A budget of 3 offboardings per hour (the managed users here are far fewer than 30).
fn brake3() -> AppOptions {
    AppOptions {
        brake: Brake { min_users: 3, max_percent: 10, window: Duration::from_secs(3600) },
        ..Default::default()
    }
}

async fn run_full(app: &App) -> Value {
    let id = app.engine.enqueue(&[full_job(Actor::reconciler(), "test")]).await.unwrap()[0].id;
    wait_state(&app.engine, id, "succeeded", Duration::from_secs(30)).await.outputs["reconcile"].clone()
}

/// `account/username` of every offboarding job, sorted.
async fn offboarded(app: &App) -> Vec<String> {
    let mut v: Vec<String> = app
        .jobs(USER_OFFBOARD)
        .await
        .iter()
        .map(|j| format!("{}/{}", j.3["account"].as_str().unwrap(), j.3["username"].as_str().unwrap()))
        .collect();
    v.sort();
    v
}

async fn held(app: &App) -> Vec<String> {
    let mut v: Vec<String> =
        sqlx::query_scalar("select item->>'account' || '/' || (item->>'username') from budget_held")
            .fetch_all(app.engine.pool())
            .await
            .unwrap();
    v.sort();
    v
}

#[tokio::test]
async fn two_tenants_emptied_at_once_share_one_budget_and_the_rest_wait_in_one_hold() {
    let db = TestDb::new().await;
    let app = app(&db, brake3()).await;
    // each tenant loses all 3 of its users: under the per-pass check (3 is not more than 3), but
    // 6 offboardings in one hour are more than the budget of 3
    app.cluster.set(&[
        ("tenant-foo", "fa"),
        ("tenant-foo", "fb"),
        ("tenant-foo", "fc"),
        ("tenant-bar", "ba"),
        ("tenant-bar", "bb"),
        ("tenant-bar", "bc"),
    ]);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let report = run_full(&app).await;
    assert_eq!(offboarded(&app).await.len(), 3, "{report}");
    assert_eq!(held(&app).await.len(), 3, "{report}");
    let holds = app.jobs("reconcile.hold").await;
    assert_eq!(holds.len(), 1, "one hold for every tenant: {holds:?}");
    let decisions: Vec<&str> =
        report["tenants"].as_array().unwrap().iter().map(|t| t["decision"].as_str().unwrap()).collect();
    assert!(decisions.contains(&"held"), "{report}");
    let hold = wait_state(&app.engine, holds[0].0, "needs_approval", Duration::from_secs(20)).await;
    assert!(hold.last_error.as_deref().unwrap().contains("offboarding budget (3 per 3600s"), "{hold:?}");
    // another pass within the hour: the budget is used, no further offboarding, still one hold
    run_full(&app).await;
    assert_eq!(offboarded(&app).await.len(), 3);
    assert_eq!(held(&app).await.len(), 3);
    assert_eq!(app.jobs("reconcile.hold").await.len(), 1);
    w.shutdown().await;
}

#[tokio::test]
async fn a_fault_that_drops_a_few_users_each_pass_is_stopped_by_the_budget() {
    let db = TestDb::new().await;
    let app = app(&db, brake3()).await;
    let names = ["u1", "u2", "u3", "u4", "u5", "u6"];
    for (i, n) in names.iter().enumerate() {
        app.add_user(FakeUser::new(i as i64 + 1, n, &["tenant-foo-users"]));
    }
    let assoc: Vec<(&str, &str)> = names.iter().map(|n| ("tenant-foo", *n)).collect();
    app.cluster.set(&assoc);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    // each pass, the fault drops two more users (2 of 6: far under the per-pass check)
    let drop = |pks: &[i64]| {
        for pk in pks {
            app.fake.lock().unwrap().users.get_mut(pk).unwrap().groups.clear();
        }
    };
    // the offboardings remove their users' associations
    let done = |users: &[&str]| app.cluster.0.lock().unwrap().retain(|(_, u)| !users.contains(&u.as_str()));
    drop(&[1, 2]);
    run_full(&app).await;
    assert_eq!(offboarded(&app).await, ["tenant-foo/u1", "tenant-foo/u2"]);
    done(&["u1", "u2"]);
    drop(&[3, 4]);
    let report = run_full(&app).await;
    // one slot was left in the hour
    assert_eq!(offboarded(&app).await.len(), 3, "{report}");
    assert_eq!(held(&app).await.len(), 1, "{report}");
    let took = offboarded(&app).await.into_iter().find(|p| p.ends_with("u3") || p.ends_with("u4")).unwrap();
    done(&[took.trim_start_matches("tenant-foo/")]);
    drop(&[5, 6]);
    let report = run_full(&app).await;
    assert_eq!(offboarded(&app).await.len(), 3, "{report}");
    assert_eq!(held(&app).await.len(), 3, "{report}");
    assert_eq!(app.jobs("reconcile.hold").await.len(), 1);
    w.shutdown().await;
}

#[tokio::test]
async fn ten_user_reconciles_offboard_the_budget_and_one_approval_releases_those_still_to_go() {
    let db = TestDb::new().await;
    let app = app(&db, brake3()).await;
    let names: Vec<String> = (1..=10).map(|i| format!("user{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        app.add_user(FakeUser::new(i as i64 + 1, n, &[])); // removed from the group
    }
    let assoc: Vec<(&str, &str)> = names.iter().map(|n| ("tenant-foo", n.as_str())).collect();
    app.cluster.set(&assoc);
    // a group diff's fan-out: one reconcile.user job per removed user
    let jobs: Vec<NewJob> = (1..=10).map(|pk| user_job(pk, Actor::reconciler(), "group diff")).collect();
    let ids: Vec<i64> = app.engine.enqueue(&jobs).await.unwrap().iter().map(|e| e.id).collect();
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    for id in &ids {
        wait_state(&app.engine, *id, "succeeded", Duration::from_secs(30)).await;
    }
    assert_eq!(offboarded(&app).await.len(), 3);
    assert_eq!(held(&app).await.len(), 7);
    let holds = app.jobs("reconcile.hold").await;
    assert_eq!(holds.len(), 1, "{holds:?}");
    let hold = wait_state(&app.engine, holds[0].0, "needs_approval", Duration::from_secs(20)).await;
    assert!(hold.last_error.as_deref().unwrap().contains("offboarding budget (3 per 3600s"), "{hold:?}");
    // while it waits, Authentik turns out to be right about two of the held users
    let gone: Vec<String> = held(&app).await.iter().map(|p| p.trim_start_matches("tenant-foo/").to_string()).collect();
    for pk in 1..=10i64 {
        let mut f = app.fake.lock().unwrap();
        let u = f.users.get_mut(&pk).unwrap();
        if gone[..2].contains(&u.username) {
            u.groups = vec!["tenant-foo-users".into()];
        }
    }
    app.engine.approve(holds[0].0, &Actor::cli("ops")).await.unwrap();
    let hold = wait_state(&app.engine, holds[0].0, "succeeded", Duration::from_secs(30)).await;
    assert_eq!(hold.outputs["release"]["released"].as_array().unwrap().len(), 7, "{}", hold.outputs);
    let after = offboarded(&app).await;
    assert_eq!(after.len(), 3 + 5, "{after:?}");
    assert!(!after.contains(&format!("tenant-foo/{}", gone[0])) && !after.contains(&format!("tenant-foo/{}", gone[1])));
    assert!(held(&app).await.is_empty());
    w.shutdown().await;
}

/// Stands in for the offboarding flow so that its kind is accepted.
fn registry() -> Registry {
    Registry::new().with(Recorded(USER_OFFBOARD)).with(Recorded("reconcile.hold"))
}

#[tokio::test]
async fn concurrent_takers_never_exceed_the_budget() {
    let db = TestDb::new().await;
    let engine = Engine::new(db.pool.clone(), registry());
    let budget = Budget { name: OFFBOARD_BUDGET.into(), limit: 5, window: Duration::from_secs(3600) };
    let mut tasks = vec![];
    for t in 0..8 {
        let (engine, budget) = (engine.clone(), budget.clone());
        tasks.push(tokio::spawn(async move {
            let metered: Vec<Metered> = (0..3)
                .map(|i| {
                    let job = NewJob::new(USER_OFFBOARD, &format!("t/u{t}-{i}"), json!({}), Actor::reconciler())
                        .dedupe(format!("off:u{t}-{i}"));
                    Metered::new(job, &json!({ "user": format!("u{t}-{i}") }))
                })
                .collect();
            let release = hold_job("budget used");
            let through =
                Through { metered: &metered, reason: "over budget", release: Some(&release), ..Default::default() };
            engine.enqueue_through(&budget, &through).await.unwrap()
        }));
    }
    let mut granted = 0;
    let mut releases = std::collections::BTreeSet::new();
    for t in tasks {
        let out = t.await.unwrap();
        granted += out.jobs.iter().filter(|j| j.is_some()).count();
        assert!(out.used <= 5, "{out:?}");
        releases.extend(out.release.map(|e| e.id));
    }
    assert_eq!(granted, 5);
    let jobs: i64 = sqlx::query_scalar("select count(*) from jobs where kind = $1")
        .bind(USER_OFFBOARD)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 5);
    assert_eq!(engine.held::<Value>(OFFBOARD_BUDGET).await.unwrap().len(), 24 - 5);
    assert_eq!(releases.len(), 1, "one release job for every holder");
    // a job already under way takes no second slot, and a new one past the budget is held
    let again = Metered::new(
        NewJob::new(USER_OFFBOARD, "t/u9", json!({}), Actor::reconciler()).dedupe("off:u9"),
        &json!({ "user": "u9" }),
    );
    let out = engine.enqueue_through(&budget, &Through { metered: &[again], ..Default::default() }).await.unwrap();
    assert_eq!((out.jobs[0], out.used), (None, 5));
    // slots leave the window as it moves on
    sqlx::query("update budget_grants set granted_at = now() - interval '2 hours'").execute(&db.pool).await.unwrap();
    let again = Metered::new(
        NewJob::new(USER_OFFBOARD, "t/u9", json!({}), Actor::reconciler()).dedupe("off:u9"),
        &json!({ "user": "u9" }),
    );
    let out = engine.enqueue_through(&budget, &Through { metered: &[again], ..Default::default() }).await.unwrap();
    assert!(out.jobs[0].is_some_and(|e| e.created), "{out:?}");
    let held = engine.held::<Value>(OFFBOARD_BUDGET).await.unwrap();
    assert!(held.iter().all(|h| h.key != "off:u9"), "what got its slot is no longer held");
}

#[tokio::test]
async fn a_user_reconcile_with_nothing_to_offboard_does_not_wait_for_the_budget() {
    let db = TestDb::new().await;
    let app = app(&db, brake3()).await;
    app.add_user(FakeUser::new(1, "member1", &["tenant-foo-users"]));
    app.cluster.set(&[("tenant-foo", "member1")]);
    // another path holds the budget's lock (a tenant pass offboarding, say) and does not let go
    sqlx::query("insert into budgets (name) values ($1) on conflict do nothing")
        .bind(OFFBOARD_BUDGET)
        .execute(app.engine.pool())
        .await
        .unwrap();
    let mut holder = app.engine.pool().begin().await.unwrap();
    sqlx::query("select name from budgets where name = $1 for update")
        .bind(OFFBOARD_BUDGET)
        .execute(&mut *holder)
        .await
        .unwrap();
    let id = app.engine.enqueue(&[user_job(1, Actor::reconciler(), "test")]).await.unwrap()[0].id;
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let job = wait_state(&app.engine, id, "succeeded", Duration::from_secs(20)).await;
    assert_eq!(job.outputs["reconcile"]["decision"], "nothing", "{}", job.outputs);
    holder.rollback().await.unwrap();
    w.shutdown().await;
}

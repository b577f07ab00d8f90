//! The delivery pump: stored deliveries become reconcile jobs off the request path, coalesced per
//! subject, each marked processed in the same transaction as its jobs; resumable after a crash,
//! shared by several pumps without doubling work, and one delivery whose jobs PostgreSQL refuses
//! does not hold up the others. And `GET /v1/deliveries/{id}` finds a delivery's jobs.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use onramp::http::access::Role;
use onramp::intake::{Delivery, DeliveryWriter, Pump};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::common::{TestDb, eventually};
use crate::http_api::token;
use crate::intake_support::*;

async fn count(engine: &onramp::engine::Engine, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(engine.pool()).await.unwrap()
}

/// POSTs `bodies` signed, `parallel` at a time; the statuses.
async fn post_many(app: &App, bodies: Vec<Value>, parallel: usize) -> Vec<u16> {
    use futures_util::StreamExt;
    futures_util::stream::iter(bodies)
        .map(|b| async move { app.post_signed(&b, None).await.status().as_u16() })
        .buffer_unordered(parallel)
        .collect()
        .await
}

fn group_event(n: usize) -> Value {
    structured(&format!("{:032x}", 0x6000_0000 + n), "model_updated", group_model("tenant-foo-users"), None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_about_one_group_is_one_reconcile_and_one_more_behind_a_started_one() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let codes = post_many(&app, (0..1000).map(group_event).collect(), 32).await;
    assert!(codes.iter().all(|c| *c == 202), "{:?}", codes.iter().filter(|c| **c != 202).collect::<Vec<_>>());
    let jobs = app.jobs("reconcile.tenant").await;
    assert_eq!(jobs.len(), 1, "1,000 deliveries about one group, no reconcile started: one job");
    assert_eq!(jobs[0].2.as_deref(), Some("reconcile.tenant:foo"));
    // every delivery leads to that job
    let led =
        count(&app.engine, &format!("select count(*) from webhook_deliveries where job_ids = '{{{}}}'", jobs[0].0))
            .await;
    assert_eq!(led, 1000);

    // the reconcile has started (it may have read Authentik before the next events): the next
    // storm queues exactly one behind it
    sqlx::query(
        "update jobs set attempt = 1, lease_owner = 'test', lease_until = now() + interval '1 hour' where id = $1",
    )
    .bind(jobs[0].0)
    .execute(app.engine.pool())
    .await
    .unwrap();
    let codes = post_many(&app, (1000..2000).map(group_event).collect(), 32).await;
    assert!(codes.iter().all(|c| *c == 202));
    let jobs = app.jobs("reconcile.tenant").await;
    assert_eq!(jobs.len(), 2, "{jobs:?}");
    assert_eq!(jobs[1].2, Some(format!("reconcile.tenant:foo:after:{}", jobs[0].0)));
    assert_eq!(jobs[1].1, "pending");

    // the counters (a round is counted just after its commit) and the pending gauge
    let metrics = eventually(Duration::from_secs(5), "the pump's counters", || async {
        let m = app.http.get(format!("{}/metrics", app.base)).send().await.unwrap().text().await.unwrap();
        m.contains("onramp_pump_deliveries_total 2000").then_some(m)
    })
    .await;
    assert!(metrics.contains("onramp_webhook_deliveries_pending 0"), "{metrics}");
    assert!(metrics.contains("onramp_pump_deliveries_total 2000"), "{metrics}");
    assert!(metrics.contains("onramp_pump_jobs_created_total 2"), "{metrics}");
    assert!(metrics.contains("onramp_pump_jobs_coalesced_total 1998"), "{metrics}");
}

/// A delivery about user `pk`, as the webhook stores it.
fn delivery(n: usize, targets: Value) -> Delivery {
    Delivery {
        id: Uuid::now_v7(),
        key: format!("test:{n}"),
        remote_addr: None,
        shape: "structured",
        action: Some("model_updated".into()),
        model: Some("authentik_core.user".into()),
        body: json!({ "n": n }),
        raw_body: None,
        targets,
        traceparent: None,
    }
}

/// Deliveries stored by a process that died before its pump took them (a writer alone).
async fn stored_unpumped(engine: &onramp::engine::Engine, ds: Vec<Delivery>) -> Vec<Uuid> {
    let writer = DeliveryWriter::start(engine.clone(), 1, 512, Arc::default());
    let mut ids = vec![];
    for d in ds {
        ids.push(writer.store(d).await.unwrap().id);
    }
    ids
}

struct Bare {
    engine: onramp::engine::Engine,
    pump: Pump,
    _fake: Fake,
}

/// The engine and a pump (not started) over `db`, without the HTTP app.
async fn bare(db: &TestDb) -> Bare {
    let (fake, ak_url) = fake_authentik().await;
    let setup = setup(&ak_url, AppOptions::default());
    let engine = engine(db, &setup, &FakeCluster::default());
    let pump = setup.pump(&engine);
    Bare { engine, pump, _fake: fake }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_stored_before_a_crash_are_processed_by_a_pump_started_later_and_a_dead_pumps_share_too() {
    let db = TestDb::new().await;
    let b = bare(&db).await;
    let ds: Vec<Delivery> = (0..300).map(|n| delivery(n, json!([format!("user:{}", n % 100)]))).collect();
    let ids = stored_unpumped(&b.engine, ds).await;
    assert_eq!(count(&b.engine, "select count(*) from webhook_deliveries where processed_at is null").await, 300);
    assert_eq!(count(&b.engine, "select count(*) from jobs").await, 0);

    // a pump that took the oldest 50 and died mid-round: its transaction holds them until its
    // connection goes, and commits nothing
    let mut dead = b.engine.pool().begin().await.unwrap();
    let held: Vec<Uuid> =
        sqlx::query_scalar("select id from webhook_deliveries_pending order by id limit 50 for update")
            .fetch_all(&mut *dead)
            .await
            .unwrap();
    assert_eq!(held.len(), 50);
    assert!(held.iter().all(|h| ids.contains(h)));

    let stop = CancellationToken::new();
    tokio::spawn(b.pump.clone().run(stop.clone()));
    eventually(Duration::from_secs(20), "the 250 free deliveries processed", || async {
        let n = count(&b.engine, "select count(*) from webhook_deliveries where processed_at is null").await;
        (n == 50).then_some(())
    })
    .await;
    dead.rollback().await.unwrap(); // the dead pump's session ends: its deliveries are free again
    pumped(&b.engine).await;
    stop.cancel();
    // one job per user (deliveries about a user whose job is pending add nothing)
    assert_eq!(count(&b.engine, "select count(*) from jobs where kind = 'reconcile.user'").await, 100);
    assert_eq!(count(&b.engine, "select count(*) from webhook_deliveries where cardinality(job_ids) = 1").await, 300);
    let processed = eventually(Duration::from_secs(5), "the pump's counter", || async {
        let n = b.pump.stats.processed.load(Relaxed);
        (n >= 300).then_some(n)
    })
    .await;
    assert_eq!(processed, 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pumps_share_the_work_and_double_nothing() {
    let db = TestDb::new().await;
    let b = bare(&db).await;
    // 3,000 deliveries about 500 users and one group
    let ds: Vec<Delivery> = (0..3000)
        .map(|n| match n % 7 {
            0 => delivery(n, json!(["group:tenant-foo-users"])),
            _ => delivery(n, json!([format!("user:{}", n % 500)])),
        })
        .collect();
    stored_unpumped(&b.engine, ds).await;
    let (one, two) = (b.pump.clone(), setup("http://127.0.0.1:9", AppOptions::default()).pump(&b.engine));
    let one = Pump { batch: 100, ..one };
    let two = Pump { batch: 100, ..two };
    let stop = CancellationToken::new();
    tokio::spawn(one.clone().run(stop.clone()));
    tokio::spawn(two.clone().run(stop.clone()));
    pumped(&b.engine).await;
    stop.cancel();
    // (a pump counts a round just after its commit)
    let (a, c) = eventually(Duration::from_secs(5), "the pumps' counters", || async {
        let (a, c) = (one.stats.processed.load(Relaxed), two.stats.processed.load(Relaxed));
        (a + c >= 3000).then_some((a, c))
    })
    .await;
    assert_eq!(a + c, 3000, "each delivery processed once: {a} + {c}");
    assert_eq!(count(&b.engine, "select count(*) from jobs where kind = 'reconcile.user'").await, 500);
    assert_eq!(count(&b.engine, "select count(*) from jobs where kind = 'reconcile.tenant'").await, 1);
    assert_eq!(count(&b.engine, "select count(*) from webhook_deliveries where cardinality(job_ids) = 1").await, 3000);
}

/// `b`'s pump, scanning every `poll`, started with a writer that hands it what it stores (as in a
/// process with the intake); cancel the token to stop the pump.
fn pump_with_writer(b: &Bare, poll: Duration) -> (DeliveryWriter, CancellationToken) {
    let pump = Pump { poll, ..b.pump.clone() };
    let stop = CancellationToken::new();
    tokio::spawn(pump.clone().run(stop.clone()));
    (DeliveryWriter::start(b.engine.clone(), 1, 512, pump.handoff.clone()), stop)
}

/// A pump takes what its own writer hands it by id and scans for the rest on its poll: deliveries
/// another process stored (and never handed over) are processed while its own writer keeps it
/// busy, not only once its own intake goes quiet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pump_busy_with_its_own_writer_still_takes_what_another_process_stored() {
    let db = TestDb::new().await;
    let b = bare(&db).await;
    let (own, stop) = pump_with_writer(&b, Duration::from_millis(200));
    // this process's intake: a delivery every 5 ms until told to stop
    let busy = CancellationToken::new();
    let load = {
        let busy = busy.clone();
        tokio::spawn(async move {
            let mut n = 10_000;
            while !busy.is_cancelled() {
                own.store(delivery(n, json!([format!("user:{n}")]))).await.unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            n - 10_000
        })
    };
    // another process's: stored, never handed to this pump
    let theirs = stored_unpumped(&b.engine, (0..50).map(|n| delivery(n, json!([format!("user:{n}")]))).collect()).await;
    eventually(Duration::from_secs(20), "the other process's deliveries processed", || async {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from webhook_deliveries where id = any($1) and processed_at is not null",
        )
        .bind(&theirs)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        (n == 50).then_some(())
    })
    .await;
    assert!(!load.is_finished(), "this process's writer was busy all along");
    busy.cancel();
    let own_stored = load.await.unwrap();
    assert!(own_stored > 0);
    pumped(&b.engine).await;
    stop.cancel();
    assert_eq!(
        count(&b.engine, "select count(*) from webhook_deliveries where cardinality(job_ids) = 1").await,
        50 + own_stored as i64
    );
}

/// Handed deliveries past the most jobs of one round go in the next round, not at the next scan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handed_deliveries_past_one_rounds_jobs_go_in_the_next_round() {
    let db = TestDb::new().await;
    let b = bare(&db).await;
    let (own, stop) = pump_with_writer(&b, Duration::from_secs(3600));
    // once one delivery is processed, the pump's first scan is behind it: what follows is handed
    own.store(delivery(9999, json!(["user:9999"]))).await.unwrap();
    pumped(&b.engine).await;
    // five deliveries of 300 users each, stored together: 1,500 jobs, more than one round takes
    let users = |n: usize| json!((0..300).map(|u| format!("user:{}", n * 300 + u)).collect::<Vec<_>>());
    let stores = (0..5).map(|n| own.store(delivery(n, users(n))));
    for stored in futures_util::future::join_all(stores).await {
        assert!(!stored.unwrap().duplicate);
    }
    pumped(&b.engine).await;
    stop.cancel();
    assert_eq!(count(&b.engine, "select count(*) from jobs where kind = 'reconcile.user'").await, 1 + 1500);
    assert_eq!(count(&b.engine, "select count(*) from webhook_deliveries where cardinality(job_ids) = 300").await, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_whose_job_cannot_be_enqueued_does_not_hold_up_the_others() {
    let db = TestDb::new().await;
    let b = bare(&db).await;
    // PostgreSQL refuses user 666's job for good and user 667's for a while
    sqlx::query(
        "create function refuse() returns trigger language plpgsql as $$
         begin
           if new.subject = 'reconcile/user/666' then raise exception 'no 666' using errcode = '22023'; end if;
           if new.subject = 'reconcile/user/667' then raise exception 'not yet 667'; end if;
           return new;
         end $$",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    sqlx::query("create trigger refuse before insert on jobs for each row execute function refuse()")
        .execute(&db.pool)
        .await
        .unwrap();
    let mut ds: Vec<Delivery> = (0..40).map(|n| delivery(n, json!([format!("user:{n}")]))).collect();
    ds.insert(10, delivery(666, json!(["user:666"])));
    ds.insert(20, delivery(667, json!(["user:667"])));
    let ids = stored_unpumped(&b.engine, ds).await;
    let stop = CancellationToken::new();
    tokio::spawn(b.pump.clone().run(stop.clone()));
    eventually(Duration::from_secs(20), "all but 667 processed", || async {
        let n = count(&b.engine, "select count(*) from webhook_deliveries where processed_at is null").await;
        (n == 1).then_some(())
    })
    .await;
    assert_eq!(count(&b.engine, "select count(*) from jobs").await, 40);
    let (error, jobs): (Option<String>, Vec<i64>) =
        sqlx::query_as("select pump_error, job_ids from webhook_deliveries where id = $1")
            .bind(ids[10])
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert!(error.as_deref().is_some_and(|e| e.contains("no 666")), "{error:?}");
    assert!(jobs.is_empty());
    // 667's failure passes: it is taken again after its backoff
    sqlx::query("drop trigger refuse on jobs").execute(&db.pool).await.unwrap();
    pumped(&b.engine).await;
    stop.cancel();
    assert_eq!(count(&b.engine, "select count(*) from jobs").await, 41);
    assert_eq!(b.pump.stats.refused.load(Relaxed), 1);
}

#[tokio::test]
async fn a_delivery_and_its_jobs_are_found_through_the_api() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let admin = token(&app.engine, "reader", Role::Viewer, None).await;
    let scoped = token(&app.engine, "foo-reader", Role::Viewer, Some("foo")).await;
    let first = structured("d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1d1", "model_updated", user_model(42), None);
    let r = app.post_signed(&first, None).await;
    assert_eq!(r.status().as_u16(), 202);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({ "delivery": v["delivery"].clone(), "duplicate": false }), "{v}");
    let id = v["delivery"].as_str().unwrap().to_string();
    // a second event about the same user while its job is pending: folded into that job
    let second = structured("d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2d2", "model_updated", user_model(42), None);
    let v2: Value = app.post_signed(&second, None).await.json().await.unwrap();
    let id2 = v2["delivery"].as_str().unwrap().to_string();

    let get = |id: String, t: String| {
        let (http, base) = (app.http.clone(), app.base.clone());
        async move {
            let r = http.get(format!("{base}/v1/deliveries/{id}")).bearer_auth(t).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let shown = eventually(Duration::from_secs(20), "the delivery processed", || {
        let get = get(id.clone(), admin.clone());
        async move {
            let (status, v) = get.await;
            assert_eq!(status, 200, "{v}");
            (v["status"] == "processed").then_some(v)
        }
    })
    .await;
    let job = app.jobs("reconcile.user").await[0].0;
    assert_eq!(shown["jobs"], json!([{ "id": job, "kind": "reconcile.user", "state": "pending" }]), "{shown}");
    assert_eq!((shown["targets"].clone(), shown["error"].clone()), (json!(["user:42"]), Value::Null));
    assert!(shown.get("body").is_none());
    let (status, folded) = get(id2, admin.clone()).await;
    assert_eq!((status, folded["jobs"][0]["id"].as_i64()), (200, Some(job)), "{folded}");
    // a tenant-scoped token sees no delivery; a malformed or unknown id
    assert_eq!(get(id.clone(), scoped).await.0, 404);
    assert_eq!(get("nope".into(), admin.clone()).await.0, 400);
    assert_eq!(get(Uuid::now_v7().to_string(), admin.clone()).await.0, 404);
    let r = app.http.get(format!("{}/v1/deliveries/{id}", app.base)).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 401);
}

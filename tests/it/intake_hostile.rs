//! Hostile deliveries at the intake: one PostgreSQL cannot store never fails its neighbours and
//! is never answered "retry"; a group diff of any size is stored with a bounded number of jobs
//! (and so of subject locks).

use std::time::{Duration, Instant};

use onramp::intake::{Delivery, DeliveryWriter, WriteError};
use serde_json::{Value, json};

use crate::common::{TestDb, eventually};
use crate::intake_support::*;

/// POSTs every raw body signed at once (all in flight together); the statuses in order.
async fn post_all(app: &App, bodies: Vec<Vec<u8>>) -> Vec<u16> {
    let sends = bodies.iter().map(|raw| async move {
        let id = format!("msg_{}", uuid::Uuid::new_v4().simple());
        app.post_raw(raw, &id, now(), WHSEC).await.status().as_u16()
    });
    futures_util::future::join_all(sends).await
}

async fn count(app: &App, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(app.engine.pool()).await.unwrap()
}

/// Defect 4 of issue 13: on the old intake, 416 of 630 good deliveries got 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_with_nul_never_fails_its_neighbours_and_is_stored_not_retried() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let (rounds, good) = (10, 63);
    let (mut bad_raw, mut good_codes, mut bad_codes) = (vec![], vec![], vec![]);
    for round in 0..rounds {
        let mut bodies: Vec<Vec<u8>> = (0..good)
            .map(|n| {
                let pk = 1000 + round * good + n;
                let body = structured(&format!("{pk:032x}"), "model_updated", user_model(pk), None);
                serde_json::to_vec(&body).unwrap()
            })
            .collect();
        // serde_json writes U+0000 as \u0000, which jsonb refuses
        let mut bad = structured(&format!("{:032x}", 90_000 + round), "model_updated", user_model(9), None);
        bad["actor"]["username"] = json!("ak\0admin");
        bad["context"]["http_request"]["user_agent"] = json!("\0");
        let bad = serde_json::to_vec(&bad).unwrap();
        assert!(String::from_utf8_lossy(&bad).contains("\\u0000"));
        bad_raw.push(bad.clone());
        bodies.insert(usize::try_from(round * 7 % good).unwrap(), bad);
        let bad_at = bodies.iter().position(|b| b == bad_raw.last().unwrap()).unwrap();
        let codes = post_all(&app, bodies).await;
        good_codes.extend(codes.iter().enumerate().filter(|(i, _)| *i != bad_at).map(|(_, c)| *c));
        bad_codes.push(codes[bad_at]);
    }
    // on the old intake: 492 of 630 (the issue saw 416) got 503
    let failed = good_codes.iter().filter(|c| **c != 202).count();
    assert_eq!(failed, 0, "good deliveries not accepted: {failed} of {}", good_codes.len());
    assert!(bad_codes.iter().all(|c| *c == 202), "the deliveries with NUL are stored, not retried: {bad_codes:?}");
    let good_total = rounds * good;
    let stored = count(&app, "select count(*) from webhook_deliveries where raw_body is null").await;
    assert_eq!(stored, good_total);
    // every good delivery's reconcile job is there: one per user
    pumped(&app.engine).await;
    let jobs = count(&app, "select count(*) from jobs where kind = 'reconcile.user'").await;
    assert_eq!(jobs, good_total + 1, "one job per good user and the NUL deliveries' user 9");
    // the NUL deliveries: the body with U+FFFD, the bytes as received beside it
    let kept: Vec<(Vec<u8>, Value)> =
        sqlx::query_as("select raw_body, body from webhook_deliveries where raw_body is not null order by raw_body")
            .fetch_all(app.engine.pool())
            .await
            .unwrap();
    bad_raw.sort();
    assert_eq!(kept.iter().map(|(raw, _)| raw.clone()).collect::<Vec<_>>(), bad_raw);
    for (_, body) in &kept {
        assert_eq!(body["actor"]["username"], "ak\u{FFFD}admin");
        assert_eq!(body["action"], "model_updated");
    }
}

fn delivery(n: usize, body: Value) -> Delivery {
    let id = uuid::Uuid::now_v7();
    Delivery {
        id,
        key: format!("test:{n}"),
        remote_addr: None,
        shape: "structured",
        action: Some("model_updated".into()),
        model: None,
        body,
        raw_body: None,
        targets: json!([format!("user:{n}")]),
        traceparent: None,
    }
}

/// Whatever PostgreSQL refuses in a shared transaction (here a NUL that reached the writer
/// unscrubbed), only that delivery gets the error, and it says sending again will not help.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_isolates_any_delivery_postgres_refuses() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let writer = DeliveryWriter::start(app.engine.clone(), 1, 512, Default::default());
    // the first delivery's transaction waits on this lock while the others queue: one batch
    let mut blocker = app.engine.pool().begin().await.unwrap();
    sqlx::query("lock table webhook_deliveries in exclusive mode").execute(&mut *blocker).await.unwrap();
    let mut set = tokio::task::JoinSet::new();
    for n in 0..100usize {
        let body = if n == 37 || n == 80 { json!({"x": "\0"}) } else { json!({"n": n}) };
        let w = writer.clone();
        set.spawn(async move { (n, w.store(delivery(n, body)).await) });
        if n == 0 {
            eventually(Duration::from_secs(10), "the writer to wait on the lock", || async {
                let waiting = count(&app, "select count(*) from pg_stat_activity where wait_event_type = 'Lock' and datname = current_database()").await;
                (waiting > 0).then_some(())
            })
            .await;
        }
    }
    eventually(Duration::from_secs(10), "99 deliveries queued", || async { (writer.queued() == 99).then_some(()) })
        .await;
    blocker.rollback().await.unwrap();
    for (n, r) in set.join_all().await {
        match (n, r) {
            (37 | 80, Err(WriteError::Refused(why))) => assert!(why.contains("22P05"), "{why}"),
            (37 | 80, other) => panic!("delivery {n}: {other:?}"),
            (_, Ok(s)) => assert!(!s.duplicate, "delivery {n}: {s:?}"),
            (_, Err(e)) => panic!("delivery {n} failed with its neighbour: {e}"),
        }
    }
    assert_eq!(count(&app, "select count(*) from webhook_deliveries").await, 98);
    // the app's pump (polling: this writer does not wake it) makes each stored delivery's job
    pumped(&app.engine).await;
    assert_eq!(count(&app, "select count(*) from jobs").await, 98);
}

fn group_diff(uuid: &str, group: Option<&str>, users: std::ops::Range<i64>) -> Value {
    let mut model = group_model(group.unwrap_or("x"));
    if group.is_none() {
        model.as_object_mut().unwrap().remove("name");
    }
    let users: Vec<i64> = users.collect();
    structured(uuid, "model_updated", model, Some(json!({ "users": { "add": users, "remove": [] } })))
}

/// Defect 5 of issue 13: 50,000 users took 50,000 advisory locks in one transaction ("out of
/// shared memory", 503 on every resend).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_diff_of_50000_users_is_stored_with_one_job_per_tenant() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let body = group_diff(&format!("{:032x}", 1), Some("tenant-foo-users"), 1..50_001);
    let raw = serde_json::to_vec(&body).unwrap();
    assert!(raw.len() < 1 << 20, "within the default body limit: {}", raw.len());
    let started = Instant::now();
    let codes = post_all(&app, vec![raw]).await;
    assert_eq!(codes, vec![202]);
    assert!(started.elapsed() < Duration::from_secs(20), "took {:?}", started.elapsed());
    assert_eq!(count(&app, "select count(*) from webhook_deliveries").await, 1);
    let tenant = app.jobs("reconcile.tenant").await;
    assert_eq!(tenant.len(), 1);
    assert_eq!(tenant[0].3["tenants"], json!(["foo"]));
    assert_eq!(count(&app, "select count(*) from jobs").await, 1);

    // a big diff of a group that names no tenant changes nothing onramp manages; one without a
    // name reconciles everything; a small one still points at each user
    let other = group_diff(&format!("{:032x}", 2), Some("unrelated"), 1..50_001);
    let nameless = group_diff(&format!("{:032x}", 3), None, 1..50_001);
    let small = group_diff(&format!("{:032x}", 4), Some("tenant-bar-users"), 1..201);
    let bodies = [other, nameless, small].iter().map(|b| serde_json::to_vec(b).unwrap()).collect();
    assert_eq!(post_all(&app, bodies).await, vec![202, 202, 202]);
    assert_eq!(app.jobs("reconcile.full").await.len(), 1);
    assert_eq!(app.jobs("reconcile.user").await.len(), 200);
    assert_eq!(count(&app, "select count(*) from webhook_deliveries").await, 4);
}

/// Many deliveries at the limit at once: each shared transaction takes a bounded number of
/// subject locks, so none runs out of PostgreSQL's lock table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_diffs_at_the_limit_at_once_are_all_stored() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    let bodies: Vec<Vec<u8>> = (0..100)
        .map(|n| {
            let users = n * 200..(n + 1) * 200;
            serde_json::to_vec(&group_diff(&format!("{:032x}", 100 + n), Some("tenant-foo-users"), users)).unwrap()
        })
        .collect();
    let codes = post_all(&app, bodies).await;
    assert!(codes.iter().all(|c| *c == 202), "{codes:?}");
    assert_eq!(app.jobs("reconcile.user").await.len(), 20_000);
}

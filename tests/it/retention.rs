//! Retention (issue #13, defect 12): finished jobs with their attempts and audit trail, and
//! stored webhook deliveries, are pruned after their settings, a batch at a time; unfinished and
//! recent ones are kept, and /v1/tenants is still right afterwards.

use std::time::Duration;

use onramp::app::retention::{Retention, prune};
use onramp::engine::{Actor, NewJob};
use onramp::http::access::Role;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use uuid::{Timestamp, Uuid};

use crate::common::{TestDb, TestWorker, engine, wait_state, worker_config};
use crate::intake_support::*;

const DAY: u64 = 86_400;

fn retention() -> Retention {
    Retention {
        jobs: Duration::from_secs(90 * DAY),
        deliveries: Duration::from_secs(14 * DAY),
        every: Duration::from_secs(3600),
    }
}

/// Puts a job in `state`, finished (or last changed) `days` ago, with an attempt and an event.
async fn age(pool: &sqlx::PgPool, id: i64, state: &str, days: i64) {
    let finished =
        if matches!(state, "succeeded" | "failed" | "cancelled") { "now() - $3 * interval '1 day'" } else { "null" };
    sqlx::query(&format!(
        // a running job is one whose lease a worker holds
        "update jobs set queue_state = case when $2 = 'running' then 'pending' else $2 end,
                         lease_owner = case when $2 = 'running' then 'test' end,
                         lease_until = case when $2 = 'running' then now() + interval '1 hour' end,
                         finished_at = {finished}, updated_at = now() - $3 * interval '1 day',
                         created_at = now() - $3 * interval '1 day' where id = $1"
    ))
    .bind(id)
    .bind(state)
    .bind(days as f64)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("insert into step_runs (job_id, step_index, step, attempt, worker, outcome) values ($1, 0, 'run', 1, 'w', 'done')")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
}

async fn count(pool: &sqlx::PgPool, sql: &str, id: i64) -> i64 {
    sqlx::query_scalar(sql).bind(id).fetch_one(pool).await.unwrap()
}

/// A delivery as the webhook stores it: a UUIDv7 id and `received_at` of its moment; processed
/// by the pump then, or still pending (listed in `webhook_deliveries_pending`).
async fn delivery(pool: &sqlx::PgPool, days_ago: u64, n: usize, processed: bool) -> Uuid {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() - days_ago * DAY;
    let id = Uuid::new_v7(Timestamp::from_unix(uuid::NoContext, secs, n as u32));
    sqlx::query(
        "with d as (
           insert into webhook_deliveries (id, delivery_key, received_at, shape, body, processed_at)
           values ($1, $2, to_timestamp($3), 'unknown', '{}', case when $4 then to_timestamp($3) end))
         insert into webhook_deliveries_pending (id) select $1 where not $4",
    )
    .bind(id)
    .bind(format!("test:{days_ago}:{n}"))
    .bind(secs as f64)
    .bind(processed)
    .execute(pool)
    .await
    .unwrap();
    id
}

#[tokio::test]
async fn old_finished_jobs_and_deliveries_are_pruned_and_recent_or_unfinished_ones_kept() {
    let db = TestDb::new().await;
    let e = engine(&db, onramp::flows::registry());
    let pool = e.pool().clone();
    let cases = [
        ("succeeded", 100, false),
        // a failed job holds its subject until a person decides: never pruned
        ("failed", 100, true),
        ("cancelled", 91, false),
        ("succeeded", 89, true),
        ("pending", 200, true),
        ("waiting", 200, true),
        ("needs_approval", 200, true),
        ("running", 200, true),
    ];
    let jobs: Vec<NewJob> = (0..cases.len())
        .map(|i| NewJob::new(onramp::flows::selftest::KIND, &format!("selftest/{i}"), json!({}), Actor::cli("test")))
        .collect();
    let ids: Vec<i64> = e.enqueue(&jobs).await.unwrap().iter().map(|x| x.id).collect();
    for (id, (state, days, _)) in ids.iter().zip(cases) {
        age(&pool, *id, state, days).await;
    }
    // more old finished jobs than one batch takes
    sqlx::query(
        "insert into jobs (kind, subject, step, queue_state, created_by, created_at, finished_at)
         select 'selftest', 'selftest/bulk' || g, 'run', 'succeeded', 'test', now() - interval '200 days',
                now() - interval '200 days' from generate_series(1, 1234) g",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut old = vec![];
    for n in 0..3 {
        old.push(delivery(&pool, 15, n, true).await);
    }
    let recent = delivery(&pool, 13, 0, true).await;
    // the pump has not processed it yet (it was down for weeks): kept, or it would be lost
    let unprocessed = delivery(&pool, 20, 9, false).await;

    let round = prune(&e, &retention(), &CancellationToken::new()).await.unwrap();
    assert_eq!(round.jobs.jobs, 2 + 1234, "{round:?}");
    assert_eq!(round.deliveries, 3, "{round:?}");
    for (id, (state, days, kept)) in ids.iter().zip(cases) {
        let what = format!("{state} {days} days ago");
        let n = |sql| count(&pool, sql, *id);
        let expect = i64::from(kept);
        assert_eq!(n("select count(*) from jobs where id = $1").await, expect, "job {what}");
        assert_eq!(n("select count(*) from step_runs where job_id = $1").await, expect, "attempts of {what}");
        assert_eq!(n("select count(*) from job_events where job_id = $1").await, expect, "events of {what}");
    }
    let left: Vec<Uuid> =
        sqlx::query_scalar("select id from webhook_deliveries order by id").fetch_all(&pool).await.unwrap();
    assert_eq!(left, [unprocessed, recent], "old processed deliveries {old:?} pruned, the pending one kept");
    // a second round finds nothing
    assert_eq!(prune(&e, &retention(), &CancellationToken::new()).await.unwrap(), Default::default());
}

#[tokio::test]
async fn the_tenants_overview_is_still_right_after_pruning() {
    let db = TestDb::new().await;
    let app = app(&db, AppOptions::default()).await;
    app.add_user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    app.cluster.set(&[("tenant-foo", "alice"), ("tenant-foo", "gone"), ("tenant-bar", "erin")]);
    let w = TestWorker::start(&app.engine, worker_config("w1", Duration::from_secs(5)));
    let full = || onramp::flows::reconcile::full_job(Actor::reconciler(), "test");
    let first = app.engine.enqueue(&[full()]).await.unwrap()[0].id;
    wait_state(&app.engine, first, "succeeded", Duration::from_secs(30)).await;
    // that first reconcile finished long ago; a newer one measured the same
    let pool = app.engine.pool().clone();
    sqlx::query("update jobs set finished_at = now() - interval '100 days' where id = $1")
        .bind(first)
        .execute(&pool)
        .await
        .unwrap();
    let latest = app.engine.enqueue(&[full()]).await.unwrap()[0].id;
    wait_state(&app.engine, latest, "succeeded", Duration::from_secs(30)).await;
    w.shutdown().await;
    let round = prune(&app.engine, &retention(), &CancellationToken::new()).await.unwrap();
    assert_eq!(round.jobs.jobs, 1, "{round:?}");

    let token = crate::http_api::token(&app.engine, "viewer", Role::Viewer, None).await;
    let body: Value = app
        .http
        .get(format!("{}/v1/tenants", app.base))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let foo = body["tenants"].as_array().unwrap().iter().find(|t| t["name"] == "foo").unwrap().clone();
    let bar = body["tenants"].as_array().unwrap().iter().find(|t| t["name"] == "bar").unwrap().clone();
    assert_eq!(foo["members"]["job"], latest, "{foo}");
    assert_eq!(
        (foo["members"]["members"].as_u64(), foo["members"]["slurm_users"].as_u64()),
        (Some(1), Some(2)),
        "{foo}"
    );
    assert_eq!(foo["drift"]["offboard"], 1, "{foo}");
    // gone's offboarding (a stand-in waiting for approval) is still in flight
    assert_eq!(foo["jobs_in_flight"]["by_kind"]["user.offboard"], 1, "{foo}");
    assert_eq!(bar["drift"]["offboard"], 1, "{bar}");
}

/// A rolling upgrade past migration 0029: replicas of the earlier release stored a delivery
/// without listing it as pending and marked one processed without taking it off; a delivery was
/// pruned while still listed. A retention round sets the list right: every unprocessed delivery
/// listed (so a pump takes it), nothing else.
#[tokio::test]
async fn a_retention_round_sets_the_pending_list_right_after_a_rolling_upgrade() {
    let db = TestDb::new().await;
    let e = engine(&db, onramp::flows::registry());
    let pool = e.pool().clone();
    let listed = delivery(&pool, 0, 1, false).await;
    let unlisted = delivery(&pool, 0, 2, false).await;
    let stale = delivery(&pool, 0, 3, true).await;
    let orphan = Uuid::now_v7();
    for (sql, id) in [
        // the earlier release stored it unlisted
        ("delete from webhook_deliveries_pending where id = $1", unlisted),
        // and marked it processed without taking it off
        ("insert into webhook_deliveries_pending (id) values ($1)", stale),
        // listed, but its delivery is gone
        ("insert into webhook_deliveries_pending (id) values ($1)", orphan),
    ] {
        sqlx::query(sql).bind(id).execute(&pool).await.unwrap();
    }
    let list = || async {
        let ids: Vec<Uuid> =
            sqlx::query_scalar("select id from webhook_deliveries_pending order by id").fetch_all(&pool).await.unwrap();
        ids
    };
    let sorted = |mut v: Vec<Uuid>| {
        v.sort();
        v
    };
    assert_eq!(list().await, sorted(vec![listed, stale, orphan]));

    let round = prune(&e, &retention(), &CancellationToken::new()).await.unwrap();
    assert_eq!((round.relisted, round.unlisted, round.deliveries), (1, 2, 0), "{round:?}");
    assert_eq!(list().await, sorted(vec![listed, unlisted]), "every unprocessed delivery listed, nothing else");
    assert_eq!(onramp::intake::pump::pending(&e).await.unwrap(), 2);
    // the list is right: a second round changes nothing
    assert_eq!(prune(&e, &retention(), &CancellationToken::new()).await.unwrap(), Default::default());
}

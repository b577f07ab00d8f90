//! A claim and a lease renewal rewrite a job's row in place (a HOT update, no index entries):
//! the lease lives in columns no index reads (migration 0027). A running job still reads as
//! `running`, due again when its lease expires.

use std::sync::Arc;
use std::time::Duration;

use onramp::engine::{Actor, JobState, NewJob, Registry, Transition};
use serde_json::json;
use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::common::*;
use crate::engine_flows::Scripted;

const SECS10: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_index_of_jobs_reads_a_column_that_a_claim_or_a_renewal_writes() {
    let db = TestDb::new().await;
    // the columns `store::claim` and `leases::renew` set, and the one computed from them
    let written = ["attempt", "lease_owner", "lease_until", "updated_at", "state"];
    let defs: Vec<String> = sqlx::query_scalar("select indexdef from pg_indexes where tablename = 'jobs'")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert!(defs.len() >= 5, "the jobs table's indexes: {defs:?}");
    for def in &defs {
        let words: Vec<&str> = def.split(|c: char| !(c.is_alphanumeric() || c == '_')).collect();
        for col in written {
            assert!(!words.contains(&col), "{def} reads `{col}`: every claim would write an entry into it");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claims_are_heap_only_updates_and_a_running_job_is_due_when_its_lease_expires() {
    let db = TestDb::new().await;
    let release = Arc::new(Notify::new());
    let r = release.clone();
    let (flow, _) = Scripted::new("t.hot", &["a"], move |_, ctx| {
        let r = r.clone();
        async move {
            if ctx.input["hold"] == json!(true) {
                r.notified().await;
            }
            Transition::Done(json!(null))
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let lease = Duration::from_secs(30);
    let w = TestWorker::start(&engine, worker_config("w1", lease));

    let held = NewJob::new("t.hot", "hold/1", json!({"hold": true}), Actor::cli("test"));
    let id = engine.enqueue(&[held]).await.unwrap()[0].id;
    let before = OffsetDateTime::now_utc();
    let j = wait_state(&engine, id, "running", SECS10).await;
    let until = j.run_at - before;
    assert!(
        until > Duration::from_secs(20) && until <= Duration::from_secs(31),
        "a running job is due again when its {lease:?} lease expires, not {until}"
    );
    assert_eq!(j.lease_owner.as_deref(), Some("w1"));
    release.notify_one();
    assert_eq!(wait_state(&engine, id, "succeeded", SECS10).await.state, JobState::Succeeded);

    let n = 50;
    let jobs: Vec<NewJob> =
        (0..n).map(|i| NewJob::new("t.hot", &format!("s/{i}"), json!({}), Actor::cli("test"))).collect();
    let ids: Vec<i64> = engine.enqueue(&jobs).await.unwrap().iter().map(|x| x.id).collect();
    for id in ids {
        wait_state(&engine, id, "succeeded", SECS10).await;
    }
    // each of the n + 1 jobs had a claim and a result; the statistics reach the view within
    // about ten seconds of the worker's connections going idle
    let claims = n + 1;
    let want = 2 * claims;
    let (updates, hot): (i64, i64) = eventually(Duration::from_secs(30), "the jobs' updates to be counted", || async {
        let (u, h): (i64, i64) =
            sqlx::query_as("select n_tup_upd, n_tup_hot_upd from pg_stat_user_tables where relname = 'jobs'")
                .fetch_one(&db.pool)
                .await
                .unwrap();
        (u >= want).then_some((u, h))
    })
    .await;
    assert!(hot >= claims, "every claim is a heap-only update: {hot} of {updates} updates were");
    w.shutdown().await;
}

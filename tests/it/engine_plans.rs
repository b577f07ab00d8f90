//! The engine's plans after a burst: jobs enqueued faster than PostgreSQL's statistics follow.

use std::time::Duration;

use onramp::engine::{Actor, NewJob, Registry, Transition};
use serde_json::json;

use crate::common::*;
use crate::engine_flows::Scripted;

const SECS30: Duration = Duration::from_secs(30);

/// Whether `jobs` was ever analyzed.
async fn analyzed(db: &TestDb) -> bool {
    sqlx::query_scalar(
        "select last_analyze is not null or last_autoanalyze is not null
         from pg_stat_user_tables where relname = 'jobs'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_finds_a_burst_has_jobs_analyzed_and_each_subjects_jobs_still_run_in_order() {
    let db = TestDb::new().await;
    let (flow, journal) = Scripted::new("t.burst", &["only"], |_, _| async { Transition::Done(json!(null)) });
    let engine = engine(&db, Registry::new().with(flow));
    let jobs: Vec<NewJob> = (0..3000)
        .map(|i| NewJob::new("t.burst", &format!("tenant-a/u{}", i % 500), json!({}), Actor::cli("test")))
        .collect();
    let ids: Vec<i64> = engine.enqueue(&jobs).await.unwrap().iter().map(|e| e.id).collect();
    // the worker starts at once: the statistics' counters may not have heard of the burst yet
    assert!(!analyzed(&db).await, "nothing analyzed jobs before a worker ran");
    let w = TestWorker::start(&engine, worker_config("w1", Duration::from_secs(10)));
    eventually(SECS30, "jobs to be analyzed", || async { analyzed(&db).await.then_some(()) }).await;
    eventually(SECS30, "every job to succeed", || async {
        let done: i64 = sqlx::query_scalar("select count(*) from jobs where state = 'succeeded'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        (done == 3000).then_some(())
    })
    .await;
    w.shutdown().await;

    // every job ran once, and each subject's jobs in the order they were enqueued
    let journal = journal.lock().unwrap().clone();
    assert_eq!(journal.len(), 3000);
    let order: Vec<i64> = journal.iter().map(|e| e.job).collect();
    for subject in 0..500 {
        let mine: Vec<i64> = order.iter().copied().filter(|id| (id - ids[0]) % 500 == subject).collect();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "subject {subject} ran out of order: {mine:?}");
    }
}

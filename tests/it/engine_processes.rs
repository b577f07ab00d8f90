//! The engine across real `onramp` processes: kill -9, two workers, restarts, SIGTERM.

use std::collections::HashMap;
use std::time::Duration;

use onramp::engine::fencing::{StepWrite, write_results};
use onramp::engine::{Actor, Engine, JobState, NewJob, StepOutcome};
use serde_json::json;

use crate::common::*;

const LEASE: &str = "2s";
const LEASE_MS: i64 = 2000;

fn selftest(db: &TestDb) -> Engine {
    engine(db, onramp::flows::registry())
}

fn job(subject: &str, input: serde_json::Value) -> NewJob {
    NewJob::new("selftest", subject, input, Actor::cli("test"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_orphaned_by_kill_9_runs_again_within_two_leases_and_the_dead_attempt_cannot_write() {
    let db = TestDb::new().await;
    let engine = selftest(&db);
    let mut first = spawn_worker_process(&db, "doomed", LEASE, &[]);
    let id = engine.enqueue(&[job("tenant-a/alice", json!({"block_attempts": 1}))]).await.unwrap()[0].id;
    let held = eventually(Duration::from_secs(20), "the blocking step to start", || async {
        let j = engine.job(id).await.unwrap();
        (j.state == JobState::Running && j.step == "work").then_some(j)
    })
    .await;
    assert_eq!(held.lease_owner.as_deref(), Some("doomed"));
    // the open attempt is read from the job's row: it has no row of its own until it ends
    let open = runs(&engine, id).await.into_iter().find(|r| r.step == "work").expect("the open attempt is listed");
    assert_eq!((open.worker.as_str(), open.outcome, open.finished_at), ("doomed", None, None));
    first.kill().await.unwrap(); // SIGKILL: no chance to release anything
    let killed_at = db_now(&db.pool).await;

    let _second = spawn_worker_process(&db, "rescuer", LEASE, &[]);
    let j = wait_state(&engine, id, "succeeded", Duration::from_secs(20)).await;
    let runs = runs(&engine, id).await;
    let work: Vec<_> = runs.iter().filter(|r| r.step == "work").collect();
    assert_eq!(work.len(), 2, "{runs:#?}");
    assert_eq!((work[0].worker.as_str(), work[0].outcome), ("doomed", Some(StepOutcome::LeaseExpired)));
    // the lost attempt's row, written by the claim that took the job over, is the one that was listed
    assert_eq!((work[0].id, work[0].started_at), (open.id, open.started_at));
    assert_eq!((work[1].worker.as_str(), work[1].outcome), ("rescuer", Some(StepOutcome::Done)));
    let recovered = (work[1].started_at - killed_at).whole_milliseconds() as i64;
    assert!(recovered <= 2 * LEASE_MS, "reclaimed {recovered} ms after kill -9 (lease {LEASE_MS} ms)");
    eprintln!("kill -9 recovery: step claimed again {recovered} ms after the kill (lease {LEASE_MS} ms)");

    // the dead worker's attempt comes back late: refused, nothing changes
    let late = StepWrite {
        id,
        step_index: held.step_index,
        attempt: held.attempt,
        step: "work",
        outcome: StepOutcome::Fail,
        new_state: JobState::Failed,
        new_step_index: held.step_index,
        new_step: "work",
        delay: Duration::ZERO,
        poll_for: Duration::ZERO,
        error: Some("late".into()),
        output: None,
        effects: None,
    };
    assert!(write_results(&db.pool, "doomed", &[late]).await.unwrap().is_empty());
    let after = engine.job(id).await.unwrap();
    assert_eq!((after.state.as_str(), after.last_error.clone()), ("succeeded", j.last_error));
    let ev = engine.events(id).await.unwrap();
    assert!(
        ev.iter().any(|e| e.actor == "worker:rescuer" && e.detail.as_deref().is_some_and(|d| d.contains("doomed")))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_processes_run_a_thousand_jobs_exactly_once_and_one_subject_at_a_time() {
    let db = TestDb::new().await;
    let engine = selftest(&db);
    let _a = spawn_worker_process(&db, "pa", "5s", &["--worker-concurrency", "16"]);
    let _b = spawn_worker_process(&db, "pb", "5s", &["--worker-concurrency", "16"]);
    wait_listening(&db, 2).await;
    let jobs: Vec<NewJob> =
        (0..1000).map(|i| job(&format!("tenant-{}/user-{}", i % 5, i % 100), json!({"sleep_ms": i % 3}))).collect();
    for chunk in jobs.chunks(250) {
        engine.enqueue(chunk).await.unwrap();
    }
    eventually(Duration::from_secs(120), "1000 jobs to succeed", || async {
        let n: i64 = sqlx::query_scalar("select count(*) from jobs where state = 'succeeded'")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        (n == 1000).then_some(())
    })
    .await;
    let bad: i64 =
        sqlx::query_scalar("select count(*) from step_runs where outcome is distinct from 'done' or attempt <> 1")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(bad, 0, "every step ran exactly once");
    let per_step: Vec<(i64,)> =
        sqlx::query_as("select count(*) from step_runs group by job_id, step_index having count(*) <> 1")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert!(per_step.is_empty());
    let total: i64 = sqlx::query_scalar("select count(*) from step_runs").fetch_one(&db.pool).await.unwrap();
    assert_eq!(total, 3000);

    // Intervals: each job from its first step's start to its last step's end (database clock),
    // and the work step's own interval as the step measured it (process clock).
    let rows: Vec<(String, i64, time::OffsetDateTime, time::OffsetDateTime, serde_json::Value)> = sqlx::query_as(
        "select j.subject, j.id, min(s.started_at), max(s.finished_at), j.outputs->'work'
         from jobs j join step_runs s on s.job_id = j.id group by j.id order by j.subject, j.id",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let mut by_subject: HashMap<&str, Vec<_>> = HashMap::new();
    let mut pids = std::collections::HashSet::new();
    for r in &rows {
        by_subject.entry(r.0.as_str()).or_default().push(r);
        pids.insert(r.4["pid"].as_u64().unwrap());
    }
    assert_eq!(by_subject.len(), 100);
    for (subject, jobs) in by_subject {
        for pair in jobs.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            assert!(b.2 >= a.3, "{subject}: job {} started at {} before job {} ended at {}", b.1, b.2, a.1, a.3);
            assert!(
                b.4["started_ms"].as_u64() >= a.4["ended_ms"].as_u64(),
                "{subject}: work of {} overlaps work of {}",
                b.1,
                a.1
            );
        }
    }
    assert_eq!(pids.len(), 2, "both processes worked");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_survives_a_restart_and_fires_once_never_early() {
    let db = TestDb::new().await;
    let engine = selftest(&db);
    let first = spawn_worker_process(&db, "before", LEASE, &[]);
    let id = engine.enqueue(&[job("tenant-a/bob", json!({"wait_ms": 3000}))]).await.unwrap()[0].id;
    let waiting = wait_state(&engine, id, "waiting", Duration::from_secs(20)).await;
    signal(&first, "-TERM");
    let mut first = first;
    let status = tokio::time::timeout(Duration::from_secs(20), first.wait()).await.unwrap().unwrap();
    assert!(status.success(), "graceful exit: {status}");
    assert_eq!(engine.job(id).await.unwrap().state, JobState::Waiting, "the timer is still pending after the restart");

    let _second = spawn_worker_process(&db, "after", LEASE, &[]);
    wait_state(&engine, id, "succeeded", Duration::from_secs(20)).await;
    let work: Vec<_> = runs(&engine, id).await.into_iter().filter(|r| r.step == "work").collect();
    let outcomes: Vec<_> = work.iter().map(|r| r.outcome.unwrap()).collect();
    assert_eq!(outcomes, [StepOutcome::Wait, StepOutcome::Done]);
    assert_eq!(work[1].worker, "after");
    let due = work[0].next_run_at.unwrap();
    assert_eq!(due, waiting.run_at);
    assert!(due - work[0].finished_at.unwrap() >= time::Duration::milliseconds(3000));
    assert!(work[1].started_at >= due, "fired early: {} < {}", work[1].started_at, due);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_running_step_finish_then_exits_zero() {
    let db = TestDb::new().await;
    let engine = selftest(&db);
    let mut child = spawn_worker_process(&db, "graceful", LEASE, &["--shutdown-grace", "10s"]);
    let id = engine.enqueue(&[job("tenant-a/carol", json!({"sleep_ms": 1500}))]).await.unwrap()[0].id;
    eventually(Duration::from_secs(20), "work to start", || async {
        let j = engine.job(id).await.unwrap();
        (j.step == "work" && j.state == JobState::Running).then_some(())
    })
    .await;
    signal(&child, "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "exit status {status}");
    let j = engine.job(id).await.unwrap();
    // work finished; the next step was left for whoever runs next
    assert_eq!((j.state.as_str(), j.step.as_str(), j.lease_owner), ("pending", "finish", None));
    let work = runs(&engine, id).await.into_iter().find(|r| r.step == "work").unwrap();
    assert_eq!(work.outcome, Some(StepOutcome::Done));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_period_releases_the_lease_for_others_at_once() {
    let db = TestDb::new().await;
    let engine = selftest(&db);
    let mut child = spawn_worker_process(&db, "slow", "30s", &["--shutdown-grace", "500ms"]);
    let id = engine.enqueue(&[job("tenant-a/dave", json!({"block_attempts": 1}))]).await.unwrap()[0].id;
    eventually(Duration::from_secs(20), "work to start", || async {
        let j = engine.job(id).await.unwrap();
        (j.step == "work" && j.state == JobState::Running).then_some(())
    })
    .await;
    signal(&child, "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(20), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "exit status {status}");
    let j = engine.job(id).await.unwrap();
    assert_eq!((j.state.as_str(), j.lease_owner), ("pending", None));
    let released = runs(&engine, id).await.into_iter().find(|r| r.step == "work").unwrap();
    assert_eq!(released.outcome, Some(StepOutcome::Released));
    // with a 30 s lease, only the release lets another worker take it now
    let _next = spawn_worker_process(&db, "next", "30s", &[]);
    wait_state(&engine, id, "succeeded", Duration::from_secs(20)).await;
}

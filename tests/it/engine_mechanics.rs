//! The engine against a real PostgreSQL, with workers in the test process.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::time::Duration;

use onramp::engine::fencing::{StepWrite, write_results};
use onramp::engine::{Actor, EngineError, JobState, NewJob, Registry, RetryPolicy, StepOutcome, Transition};
use serde_json::json;
use time::OffsetDateTime;
use tokio::sync::Notify;

use crate::common::*;
use crate::engine_flows::{Scripted, count};

const SECS10: Duration = Duration::from_secs(10);

fn job(kind: &str, subject: &str) -> NewJob {
    NewJob::new(kind, subject, json!({}), Actor::cli("test"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_run_in_order_outputs_carry_over_and_every_change_is_audited() {
    let db = TestDb::new().await;
    let (flow, journal) = Scripted::new("t.order", &["a", "b", "c"], |i, ctx| async move {
        match i {
            0 => Transition::Done(json!({"n": 1})),
            1 => Transition::Done(json!({"n": ctx.output("a").unwrap()["n"].as_i64().unwrap() + 1})),
            _ => Transition::Done(json!({"seen": ctx.outputs})),
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let id = engine.enqueue(&[job("t.order", "tenant-a/alice")]).await.unwrap()[0].id;
    let j = wait_state(&engine, id, "succeeded", SECS10).await;
    assert_eq!(j.outputs["b"], json!({"n": 2}));
    assert_eq!(j.outputs["c"]["seen"]["a"], json!({"n": 1}));
    let steps: Vec<_> = journal.lock().unwrap().iter().map(|e| e.step).collect();
    assert_eq!(steps, ["a", "b", "c"]);
    let runs = runs(&engine, id).await;
    assert!(runs.iter().all(|r| r.outcome == Some(StepOutcome::Done) && r.attempt == 1 && r.worker == "w1"));
    let ev: Vec<_> =
        engine.events(id).await.unwrap().into_iter().map(|e| (e.from_state, e.to_state, e.actor)).collect();
    assert_eq!(
        ev,
        [
            (None, JobState::Pending, "cli:test".into()),
            (Some(JobState::Pending), JobState::Running, "worker:w1".into()),
            (Some(JobState::Running), JobState::Succeeded, "worker:w1".into()),
        ]
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_back_off_by_the_policy_and_give_up_after_the_last_attempt() {
    let db = TestDb::new().await;
    let (flow, journal) = Scripted::new("t.retry", &["flaky"], |_, ctx| async move {
        let give_up = ctx.input["always_fail"].as_bool().unwrap_or(false);
        if give_up || ctx.attempt < 3 {
            Transition::Retry(format!("flake {}", ctx.attempt))
        } else {
            Transition::Done(json!(null))
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let ok = engine.enqueue(&[job("t.retry", "s/1")]).await.unwrap()[0].id;
    let mut bad = job("t.retry", "s/2");
    bad.input = json!({"always_fail": true});
    let bad = engine.enqueue(&[bad]).await.unwrap()[0].id;
    wait_state(&engine, ok, "succeeded", SECS10).await;
    let runs_ok = runs(&engine, ok).await;
    let outcomes: Vec<_> = runs_ok.iter().map(|r| r.outcome.unwrap()).collect();
    assert_eq!(outcomes, [StepOutcome::Retry, StepOutcome::Retry, StepOutcome::Done]);
    // fast_policy: 200 ms, then 400 ms, each jittered into [half, full]
    for (i, base_ms) in [(0, 200i64), (1, 400)] {
        let r = &runs_ok[i];
        let planned = (r.next_run_at.unwrap() - r.finished_at.unwrap()).whole_milliseconds() as i64;
        assert!(planned >= base_ms / 2 && planned <= base_ms + 5, "retry {i}: planned {planned} ms");
        let actual = (runs_ok[i + 1].started_at - r.finished_at.unwrap()).whole_milliseconds() as i64;
        assert!(actual >= planned - 2, "retry {i} ran early: {actual} < {planned}");
    }
    assert_eq!(runs_ok[0].error.as_deref(), Some("flake 1"));
    let attempts: Vec<u32> = journal.lock().unwrap().iter().filter(|e| e.job == ok).map(|e| e.attempt).collect();
    assert_eq!(attempts, [1, 2, 3]);
    let j = wait_state(&engine, bad, "failed", SECS10).await;
    assert_eq!(j.last_error.as_deref(), Some("gave up after 4 attempts: flake 4"));
    assert_eq!(runs(&engine, bad).await.len(), 4);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_in_the_past_fire_at_once_and_timers_in_the_future_never_early() {
    let db = TestDb::new().await;
    let (flow, journal) = Scripted::new("t.timer", &["sleepy"], |_, ctx| async move {
        let wait = ctx.input["wait_ms"].as_u64().unwrap_or(0);
        if wait > 0 && !ctx.waited {
            Transition::Wait(Duration::from_millis(wait))
        } else {
            Transition::Done(json!(null))
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let now = db_now(&db.pool).await;
    let past = job("t.timer", "s/past").at(now - time::Duration::hours(1));
    let future_at = now + time::Duration::milliseconds(1500);
    let future = job("t.timer", "s/future").at(future_at);
    let mut waits = job("t.timer", "s/wait");
    waits.input = json!({"wait_ms": 800});
    let ids: Vec<i64> = engine.enqueue(&[past, future, waits]).await.unwrap().iter().map(|e| e.id).collect();

    wait_state(&engine, ids[0], "succeeded", Duration::from_secs(2)).await;
    let j = wait_state(&engine, ids[1], "succeeded", SECS10).await;
    let r = &runs(&engine, j.id).await[0];
    assert!(r.started_at >= future_at, "started {} before its time {}", r.started_at, future_at);

    wait_state(&engine, ids[2], "succeeded", SECS10).await;
    let r = runs(&engine, ids[2]).await;
    assert_eq!(r.iter().map(|r| r.outcome.unwrap()).collect::<Vec<_>>(), [StepOutcome::Wait, StepOutcome::Done]);
    assert!(r[1].started_at - r[0].finished_at.unwrap() >= time::Duration::milliseconds(800));
    let seen: Vec<bool> = journal.lock().unwrap().iter().filter(|e| e.job == ids[2]).map(|e| e.waited).collect();
    assert_eq!(seen, [false, true]);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_is_idempotent_by_dedupe_key_while_the_job_is_unfinished() {
    let db = TestDb::new().await;
    let (flow, _) = Scripted::new("t.dedupe", &["only"], |_, _| async { Transition::Done(json!(null)) });
    let engine = engine(&db, Registry::new().with(flow));
    let a = job("t.dedupe", "s/1").dedupe("onboard:alice");
    let first = engine.enqueue(&[a.clone(), a.clone()]).await.unwrap();
    assert!(first[0].created && !first[1].created && first[0].id == first[1].id, "{first:?}");
    let again = engine.enqueue(std::slice::from_ref(&a)).await.unwrap();
    assert_eq!((again[0].id, again[0].created), (first[0].id, false));
    let count: i64 = sqlx::query_scalar("select count(*) from jobs").fetch_one(&db.pool).await.unwrap();
    assert_eq!(count, 1);

    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    wait_state(&engine, first[0].id, "succeeded", SECS10).await;
    let later = engine.enqueue(&[a]).await.unwrap();
    assert!(later[0].created && later[0].id != first[0].id);
    let unknown = engine.enqueue(&[job("t.nope", "s/1")]).await.unwrap_err();
    assert!(matches!(unknown, EngineError::UnknownKind(k) if k == "t.nope"));
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_of_one_subject_never_run_at_once() {
    let db = TestDb::new().await;
    let gate = Arc::new(Notify::new());
    let g = gate.clone();
    let (flow, journal) = Scripted::new("t.gate", &["held", "after"], move |i, ctx| {
        let g = g.clone();
        async move {
            if i == 0 && ctx.input["hold"].as_bool().unwrap_or(false) {
                g.notified().await;
            }
            Transition::Done(json!(null))
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let mut first = job("t.gate", "tenant-a/alice");
    first.input = json!({"hold": true});
    let a = engine.enqueue(&[first]).await.unwrap()[0].id;
    wait_state(&engine, a, "running", SECS10).await;
    let b = engine.enqueue(&[job("t.gate", "tenant-a/alice")]).await.unwrap()[0].id;
    let other = engine.enqueue(&[job("t.gate", "tenant-a/bob")]).await.unwrap()[0].id;
    // another subject is not held up
    wait_state(&engine, other, "succeeded", SECS10).await;
    assert_eq!(engine.job(b).await.unwrap().state, JobState::Pending);
    assert_eq!(count(&journal, b, "held"), 0);
    gate.notify_one();
    wait_state(&engine, b, "succeeded", SECS10).await;
    let last_a = runs(&engine, a).await.last().unwrap().finished_at.unwrap();
    let first_b = runs(&engine, b).await[0].started_at;
    assert!(first_b >= last_a, "b started {first_b} before a finished {last_a}");
    w.shutdown().await;
}

struct SetOnDrop(Arc<AtomicBool>);
impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_stops_a_running_step_and_its_late_result_is_refused() {
    let db = TestDb::new().await;
    let stopped = Arc::new(AtomicBool::new(false));
    let s = stopped.clone();
    let (flow, _) = Scripted::new("t.cancel", &["long", "never"], move |_, _| {
        let guard = SetOnDrop(s.clone());
        async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            drop(guard);
            Transition::Done(json!(null))
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let id = engine.enqueue(&[job("t.cancel", "s/1")]).await.unwrap()[0].id;
    let running = wait_state(&engine, id, "running", SECS10).await;
    let j = engine.cancel(id, &Actor::api("ops"), Some("wrong tenant")).await.unwrap();
    assert_eq!(j.state, JobState::Cancelled);
    eventually(Duration::from_secs(5), "the step to be stopped", || async { stopped.load(SeqCst).then_some(()) }).await;
    let write = StepWrite {
        id,
        step_index: 0,
        attempt: running.attempt,
        step: "long",
        outcome: StepOutcome::Done,
        new_state: JobState::Running,
        new_step_index: 1,
        new_step: "never",
        delay: SECS10,
        poll_for: Duration::ZERO,
        error: None,
        output: Some(json!(null)),
        effects: None,
    };
    assert!(write_results(&db.pool, "w1", &[write]).await.unwrap().is_empty(), "a write after cancel must be refused");
    let j = engine.job(id).await.unwrap();
    assert_eq!((j.state.as_str(), j.step.as_str()), ("cancelled", "long"));
    let r = runs(&engine, id).await;
    assert_eq!((r.len(), r[0].outcome), (1, Some(StepOutcome::Cancelled)));
    let last = engine.events(id).await.unwrap().pop().unwrap();
    assert_eq!(
        (last.to_state.as_str(), last.actor.as_str(), last.detail.as_deref()),
        ("cancelled", "api:ops", Some("wrong tenant"))
    );
    let again = engine.cancel(id, &Actor::api("ops"), None).await.unwrap_err();
    assert!(matches!(again, EngineError::InvalidState { .. }), "{again}");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_runs_a_failed_job_again_from_the_failed_step_only() {
    let db = TestDb::new().await;
    let calls = Arc::new(AtomicU32::new(0));
    let c = calls.clone();
    let (flow, journal) = Scripted::new("t.fail", &["a", "b", "c"], move |i, _| {
        let c = c.clone();
        async move {
            if i == 1 && c.fetch_add(1, SeqCst) == 0 {
                return Transition::Fail("quota service said no".into());
            }
            Transition::Done(json!(i))
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let id = engine.enqueue(&[job("t.fail", "s/1")]).await.unwrap()[0].id;
    let j = wait_state(&engine, id, "failed", SECS10).await;
    assert_eq!((j.step.as_str(), j.last_error.as_deref()), ("b", Some("quota service said no")));
    assert!(matches!(engine.approve(id, &Actor::api("ops")).await, Err(EngineError::InvalidState { .. })));
    engine.retry(id, &Actor::api("ops")).await.unwrap();
    wait_state(&engine, id, "succeeded", SECS10).await;
    assert_eq!((count(&journal, id, "a"), count(&journal, id, "b"), count(&journal, id, "c")), (1, 2, 1));
    let ev = engine.events(id).await.unwrap();
    assert!(
        ev.iter()
            .any(|e| e.from_state == Some(JobState::Failed) && e.to_state == JobState::Pending && e.actor == "api:ops")
    );
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approval_pauses_a_step_until_someone_approves_it() {
    let db = TestDb::new().await;
    let (flow, journal) = Scripted::new("t.approve", &["drain", "cutoff"], |i, ctx| async move {
        if i == 1 && !ctx.approved() {
            return Transition::NeedsApproval("2 jobs still running: hard cutoff?".into());
        }
        Transition::Done(json!(ctx.approved_by))
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let id = engine.enqueue(&[job("t.approve", "s/1")]).await.unwrap()[0].id;
    let j = wait_state(&engine, id, "needs_approval", SECS10).await;
    assert_eq!(j.last_error.as_deref(), Some("2 jobs still running: hard cutoff?"));
    engine.approve(id, &Actor::api("carol")).await.unwrap();
    let j = wait_state(&engine, id, "succeeded", SECS10).await;
    assert_eq!(j.outputs["cutoff"], json!("api:carol"));
    let cut: Vec<_> =
        journal.lock().unwrap().iter().filter(|e| e.step == "cutoff").map(|e| e.approved_by.clone()).collect();
    assert_eq!(cut, [None, Some("api:carol".to_string())]);
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_repeats_until_done_and_fails_past_its_deadline() {
    let db = TestDb::new().await;
    let ready = Arc::new(AtomicBool::new(false));
    let r = ready.clone();
    let (flow, _) = Scripted::new("t.poll", &["drain"], move |_, ctx| {
        let r = r.clone();
        async move {
            let forever = ctx.input["forever"].as_bool().unwrap_or(false);
            if !forever && r.load(SeqCst) {
                return Transition::Done(json!(null));
            }
            Transition::Poll { every: Duration::from_millis(100), for_at_most: Duration::from_millis(700) }
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let mut stuck = job("t.poll", "s/2");
    stuck.input = json!({"forever": true});
    let ids: Vec<i64> = engine.enqueue(&[job("t.poll", "s/1"), stuck]).await.unwrap().iter().map(|e| e.id).collect();
    eventually(SECS10, "three polls", || async { (runs(&engine, ids[0]).await.len() >= 3).then_some(()) }).await;
    ready.store(true, SeqCst);
    wait_state(&engine, ids[0], "succeeded", SECS10).await;
    let j = wait_state(&engine, ids[1], "failed", SECS10).await;
    assert_eq!(j.last_error.as_deref(), Some("step drain was still polling when its deadline passed"));
    let r = runs(&engine, ids[1]).await;
    let span = r.last().unwrap().started_at - r[0].started_at;
    assert!(span >= time::Duration::milliseconds(700) && span < time::Duration::seconds(3), "polled for {span}");
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_or_hanging_step_is_retried() {
    let db = TestDb::new().await;
    let (flow, _) = Scripted::new("t.panic", &["p"], |_, ctx| async move {
        match (ctx.input["mode"].as_str(), ctx.attempt) {
            (Some("panic"), 1) => panic!("bad bytes"),
            (Some("hang"), 1) => std::future::pending().await,
            _ => Transition::Done(json!(null)),
        }
    });
    let flow = flow.with_policy(RetryPolicy { timeout: Duration::from_secs(2), ..crate::engine_flows::fast_policy() });
    let engine = engine(&db, Registry::new().with(flow));
    let w = TestWorker::start(&engine, worker_config("w1", SECS10));
    let mut p = job("t.panic", "s/1");
    p.input = json!({"mode": "panic"});
    let mut h = job("t.panic", "s/2");
    h.input = json!({"mode": "hang"});
    let ids: Vec<i64> = engine.enqueue(&[p, h]).await.unwrap().iter().map(|e| e.id).collect();
    for (id, msg) in [(ids[0], "step p panicked: bad bytes"), (ids[1], "step p timed out after 2s")] {
        wait_state(&engine, id, "succeeded", SECS10).await;
        let r = runs(&engine, id).await;
        assert_eq!(r[0].error.as_deref(), Some(msg));
        assert_eq!(r[1].outcome, Some(StepOutcome::Done));
    }
    w.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_job_list_pages_by_keyset_and_filters() {
    let db = TestDb::new().await;
    let (flow, _) = Scripted::new("t.list", &["x"], |_, _| async { Transition::Done(json!(null)) });
    let engine = engine(&db, Registry::new().with(flow));
    let jobs: Vec<NewJob> = (0..7).map(|i| job("t.list", &format!("tenant-{}/u{i}", i % 2))).collect();
    engine.enqueue(&jobs).await.unwrap();
    let mut seen = vec![];
    let mut before = None;
    loop {
        let f = onramp::engine::JobFilter { before_id: before, limit: 3, ..Default::default() };
        let page = engine.list(&f).await.unwrap();
        // an insert between pages does not shift them
        engine.enqueue(&[job("t.list", "tenant-9/late")]).await.unwrap();
        if page.is_empty() {
            break;
        }
        before = page.last().map(|j| j.id);
        seen.extend(page.into_iter().map(|j| j.subject));
    }
    assert_eq!(seen.len(), 7, "{seen:?}");
    let f = onramp::engine::JobFilter { subject: Some("tenant-0/".into()), limit: 50, ..Default::default() };
    assert_eq!(engine.list(&f).await.unwrap().len(), 4);
    let since = OffsetDateTime::now_utc() + time::Duration::hours(1);
    let f = onramp::engine::JobFilter { created_since: Some(since), limit: 50, ..Default::default() };
    assert!(engine.list(&f).await.unwrap().is_empty());
}

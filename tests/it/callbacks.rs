//! Callbacks to a portal (issue #15): a receiver written in Python verifies every delivery with
//! the independent `standardwebhooks` package (scripts/test installs it), and can fail the first
//! requests. Each wanted event arrives, verified, in order, with a stable `webhook-id`, after
//! failures (500, then 429 with Retry-After) and after the worker restarts.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use onramp::app::world::World;
use onramp::engine::{Actor, CallbackConfig, Engine, JobState, NewJob, Registry, Transition};
use onramp::http::access::Role;
use reqwest::StatusCode;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpListener;
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::engine_flows::Scripted;
use crate::http_api::token;

const SECS20: Duration = Duration::from_secs(20);

struct Receiver {
    url: String,
    log: PathBuf,
    secret: PathBuf,
    _dir: tempfile::TempDir,
    _child: Child,
}

impl Receiver {
    /// Started with no secret: [`Receiver::trust`] gives it once subscribed.
    async fn start(fail: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("got.jsonl");
        let secret = dir.path().join("secret");
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/fixtures/callback_receiver.py");
        let mut child = Command::new("python3")
            .args([script, "--secret-file"])
            .arg(&secret)
            .arg("--log")
            .arg(&log)
            .args(["--fail", fail])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("python3");
        let mut first = String::new();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        tokio::time::timeout(SECS20, out.read_line(&mut first)).await.expect("the receiver starts").unwrap();
        let port: u16 = first.trim().parse().unwrap_or_else(|_| {
            panic!("the receiver printed {first:?}, not its port (is standardwebhooks installed? scripts/test does)")
        });
        Self { url: format!("http://127.0.0.1:{port}/hooks/onramp"), log, secret, _dir: dir, _child: child }
    }

    fn trust(&self, secret: &str) {
        std::fs::write(&self.secret, secret).unwrap();
    }

    /// Every request it got, in order.
    fn got(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// The ids of the events it accepted, first acceptance of each, in order.
    fn accepted(&self) -> Vec<i64> {
        let mut ids = vec![];
        for r in self.got().iter().filter(|r| r["status"].as_u64().is_some_and(|s| s < 300)) {
            let id = r["payload"]["data"]["event_id"].as_i64().unwrap();
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
        ids
    }

    async fn wait_for(&self, want: &[i64]) {
        eventually(SECS20, &format!("the receiver to accept events {want:?}"), || async {
            let got = self.accepted();
            want.iter().all(|id| got.contains(id)).then_some(())
        })
        .await
    }
}

fn fast() -> CallbackConfig {
    CallbackConfig {
        timeout: Duration::from_secs(5),
        backoff: Duration::from_millis(100),
        max_backoff: Duration::from_secs(5),
        poll: Duration::from_millis(100),
        ..CallbackConfig::default()
    }
}

/// The API and a worker (which delivers callbacks) in the test process.
async fn world(engine: &Engine, worker: &str) -> (String, CancellationToken, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let world = World::bare(engine.clone()).with_callbacks(fast());
    let (s, cfg) = (stop.clone(), worker_config(worker, Duration::from_secs(10)));
    let handle = tokio::spawn(async move { world.run(Some(listener), Some(cfg), s).await.unwrap() });
    (base, stop, handle)
}

fn job(subject: &str, outcome: &str) -> NewJob {
    NewJob::new("t.cb", subject, json!({"outcome": outcome}), Actor::cli("test"))
}

fn flow() -> Scripted {
    Scripted::new("t.cb", &["only"], |_, ctx| async move {
        match ctx.input["outcome"].as_str() {
            Some("fail") => Transition::Fail("the cluster said no".into()),
            Some("approve") if ctx.approved_by.is_none() => Transition::NeedsApproval("a person decides".into()),
            _ => Transition::Done(json!({})),
        }
    })
    .0
}

/// The ids of `job`'s events that entered one of `states`.
async fn event_ids(engine: &Engine, job: i64, states: &[JobState]) -> Vec<i64> {
    let events = engine.events(job).await.unwrap();
    events.into_iter().filter(|e| states.contains(&e.to_state)).map(|e| e.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_signed_in_order_retried_and_outlive_a_worker_restart() {
    let db = TestDb::new().await;
    let engine = engine(&db, Registry::new().with(flow()));
    let (base, stop, handle) = world(&engine, "w1").await;
    let http = reqwest::Client::new();
    let admin = token(&engine, "admin", Role::Admin, None).await;

    // the receiver fails its first two requests: 500, then 429 with Retry-After: 1
    let rx = Receiver::start("500,429:1").await;
    // subscribe through the API: the secret is shown once
    let res = http
        .post(format!("{base}/v1/callbacks"))
        .bearer_auth(&admin)
        .json(&json!({"url": rx.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let sub: Value = res.json().await.unwrap();
    let secret = sub["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_"), "{sub}");
    assert_eq!(sub["events"], json!(["job.succeeded", "job.failed", "job.needs_approval", "job.cancelled"]));
    rx.trust(secret);
    // another subscription, deleted: it gets nothing, and has its own secret
    let res = http
        .post(format!("{base}/v1/callbacks"))
        .bearer_auth(&admin)
        .json(&json!({"url": rx.url, "events": ["job.pending"]}))
        .send()
        .await
        .unwrap();
    let other: Value = res.json().await.unwrap();
    assert_ne!(other["secret"], sub["secret"]);
    let del = |id: &Value| http.post(format!("{base}/v1/callbacks/{id}/delete")).bearer_auth(&admin).send();
    assert_eq!(del(&other["id"]).await.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(del(&other["id"]).await.unwrap().status(), StatusCode::NOT_FOUND);
    // refused: an unknown event type, a URL that is not http(s)
    for bad in [json!({"url": rx.url, "events": ["job.done"]}), json!({"url": "file:///etc/passwd"})] {
        let res = http.post(format!("{base}/v1/callbacks")).bearer_auth(&admin).json(&bad).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNPROCESSABLE_ENTITY, "{bad}");
    }

    // listed without the secret
    let list: Value =
        http.get(format!("{base}/v1/callbacks")).bearer_auth(&admin).send().await.unwrap().json().await.unwrap();
    assert_eq!(list["callbacks"].as_array().unwrap().len(), 1, "{list}");
    assert!(!list.to_string().contains("whsec_"), "{list}");

    let ok = engine.enqueue(&[job("foo/alice", "ok")]).await.unwrap()[0].id;
    wait_state(&engine, ok, "succeeded", SECS20).await;
    let bad = engine.enqueue(&[job("bar/bob", "fail")]).await.unwrap()[0].id;
    wait_state(&engine, bad, "failed", SECS20).await;
    let ask = engine.enqueue(&[job("foo/carol", "approve")]).await.unwrap()[0].id;
    wait_state(&engine, ask, "needs_approval", SECS20).await;
    let in_an_hour = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let later = engine.enqueue(&[job("foo/dave", "ok").at(in_an_hour)]).await.unwrap()[0].id;
    engine.cancel(later, &Actor::cli("test"), Some("not needed")).await.unwrap();
    let finished = [JobState::Succeeded, JobState::Failed, JobState::NeedsApproval, JobState::Cancelled];
    let mut want = vec![];
    for id in [ok, bad, ask, later] {
        want.extend(event_ids(&engine, id, &finished).await);
    }
    assert_eq!(want.len(), 4);
    rx.wait_for(&want).await;

    let got = rx.got();
    // every request verified by the independent implementation
    assert!(got.iter().all(|r| r["verified"] == true), "{got:?}");
    // the first two failed, and the same event (same webhook-id) came again until accepted
    assert_eq!(got[0]["status"], 500);
    assert_eq!(got[1]["status"], 429);
    assert_eq!(got[0]["webhook_id"], got[2]["webhook_id"]);
    assert_eq!(got[1]["webhook_id"], got[2]["webhook_id"]);
    assert_eq!(got[2]["webhook_id"], format!("evt_{}", want[0]));
    let waited = got[2]["t"].as_f64().unwrap() - got[1]["t"].as_f64().unwrap();
    assert!(waited >= 0.9, "Retry-After: 1 was honoured: the next attempt came {waited}s later");
    // in order, each once accepted, and nothing not asked for (pending, running)
    assert_eq!(rx.accepted(), want);
    let first = &got[2]["payload"];
    assert_eq!(first["type"], "job.succeeded");
    assert_eq!(first["data"]["id"], ok);
    assert_eq!(first["data"]["subject"], "foo/alice");
    assert_eq!(first["data"]["kind"], "t.cb");
    let failed = got.iter().find(|r| r["payload"]["type"] == "job.failed").unwrap();
    assert_eq!(failed["payload"]["data"]["last_error"], "the cluster said no");
    let cancelled = got.iter().find(|r| r["payload"]["type"] == "job.cancelled").unwrap();
    assert_eq!(cancelled["payload"]["data"]["tenant"], "foo");
    // the subscription tells how delivery went
    let list: Value =
        http.get(format!("{base}/v1/callbacks")).bearer_auth(&admin).send().await.unwrap().json().await.unwrap();
    let s = &list["callbacks"][0];
    assert_eq!((s["delivered"].as_i64(), s["given_up"].as_i64(), s["attempts"].as_i64()), (Some(4), Some(0), Some(0)));

    // the worker goes away; events happen meanwhile; another worker process delivers them
    stop.cancel();
    handle.await.unwrap();
    let queued: Vec<i64> =
        engine.enqueue(&[job("foo/erin", "ok"), job("bar/frank", "ok")]).await.unwrap().iter().map(|e| e.id).collect();
    for id in &queued {
        engine.cancel(*id, &Actor::cli("test"), None).await.unwrap();
    }
    let mut more = vec![];
    for id in &queued {
        more.extend(event_ids(&engine, *id, &finished).await);
    }
    let before = rx.got().len();
    let mut w = spawn_worker_process(&db, "w2", "10s", &["--callback-poll", "100ms", "--callback-backoff", "100ms"]);
    rx.wait_for(&more).await;
    let mut all = want.clone();
    all.extend(&more);
    assert_eq!(rx.accepted(), all, "in order across the restart, none twice accepted");
    assert!(rx.got()[before..].iter().all(|r| r["verified"] == true));
    w.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_subscription_gets_its_tenants_events_only_and_a_deleted_one_nothing() {
    let db = TestDb::new().await;
    let engine = engine(&db, Registry::new().with(flow()));
    let new = |tenant: Option<&str>, url: &str| onramp::engine::NewSubscription {
        url: url.into(),
        tenant: tenant.map(str::to_string),
        events: vec!["job.cancelled".parse().unwrap()],
        created_by: "test".into(),
    };
    let rx = Receiver::start("").await;
    let (foo, secret) = engine.create_subscription(&new(Some("foo"), &rx.url)).await.unwrap();
    rx.trust(secret.expose());
    let (_, stop, handle) = world(&engine, "w1").await;
    let at = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let ids: Vec<i64> = engine
        .enqueue(&[job("bar/a", "ok").at(at), job("foo/b", "ok").at(at), job("bar/c", "ok").at(at)])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    for id in &ids {
        engine.cancel(*id, &Actor::cli("test"), None).await.unwrap();
    }
    let want = event_ids(&engine, ids[1], &[JobState::Cancelled]).await;
    rx.wait_for(&want).await;
    // the events after it are all done for this subscription: nothing else was sent
    let last = *event_ids(&engine, ids[2], &[JobState::Cancelled]).await.last().unwrap();
    eventually(SECS20, "the cursor to pass bar's events", || async {
        let subs = engine.subscriptions().await.unwrap();
        subs.iter().find(|s| s.id == foo.id).is_some_and(|s| s.cursor >= last).then_some(())
    })
    .await;
    assert_eq!(rx.accepted(), want);
    assert!(rx.got().iter().all(|r| r["payload"]["data"]["tenant"] == "foo" && r["verified"] == true));
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_committing_late_is_delivered_in_its_place_and_a_rolled_back_one_is_passed() {
    let db = TestDb::new().await;
    let engine = engine(&db, Registry::new().with(flow()));
    let rx = Receiver::start("").await;
    let new = onramp::engine::NewSubscription {
        url: rx.url.clone(),
        tenant: None,
        events: vec!["job.pending".parse().unwrap(), "job.cancelled".parse().unwrap()],
        created_by: "test".into(),
    };
    let (sub, secret) = engine.create_subscription(&new).await.unwrap();
    rx.trust(secret.expose());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let stop = CancellationToken::new();
    let cfg = CallbackConfig { settle: Duration::from_secs(1), ..fast() };
    let world = World::bare(engine.clone()).with_callbacks(cfg);
    let (s, w) = (stop.clone(), worker_config("w1", Duration::from_secs(10)));
    let handle = tokio::spawn(async move { world.run(Some(listener), Some(w), s).await.unwrap() });
    let at = time::OffsetDateTime::now_utc() + time::Duration::hours(1);

    // a transaction takes an event id and stays open while later events commit
    let mut slow = db.pool.begin().await.unwrap();
    let early = engine.enqueue_in(&mut slow, &[job("foo/early", "ok").at(at)]).await.unwrap()[0].id;
    let next = engine.enqueue(&[job("foo/next", "ok").at(at)]).await.unwrap()[0].id;
    engine.cancel(next, &Actor::cli("test"), None).await.unwrap();
    // the dispatcher waits at the missing id, and sends nothing after it meanwhile
    eventually(SECS20, "the subscription to hold at the missing event", || async {
        let held: Option<time::OffsetDateTime> =
            sqlx::query_scalar("select held_since from callback_subscriptions where id = $1")
                .bind(sub.id)
                .fetch_one(&db.pool)
                .await
                .unwrap();
        held.map(|_| ())
    })
    .await;
    assert!(rx.got().is_empty(), "{:?}", rx.got());
    slow.commit().await.unwrap();
    let mut want = event_ids(&engine, early, &[JobState::Pending]).await;
    want.extend(event_ids(&engine, next, &[JobState::Pending, JobState::Cancelled]).await);
    assert!(want.windows(2).all(|w| w[0] < w[1]), "{want:?}");
    rx.wait_for(&want).await;
    assert_eq!(rx.accepted(), want, "the late event in its place");

    // a rolled-back insert leaves its id missing for good: passed after the settle time
    let mut gone = db.pool.begin().await.unwrap();
    engine.enqueue_in(&mut gone, &[job("foo/gone", "ok").at(at)]).await.unwrap();
    let after = engine.enqueue(&[job("foo/after", "ok").at(at)]).await.unwrap()[0].id;
    gone.rollback().await.unwrap();
    let more = event_ids(&engine, after, &[JobState::Pending]).await;
    rx.wait_for(&more).await;
    want.extend(more);
    assert_eq!(rx.accepted(), want);
    assert!(rx.got().iter().all(|r| r["verified"] == true));
    stop.cancel();
    handle.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_workers_deliver_each_event_once_in_order() {
    let db = TestDb::new().await;
    let engine = engine(&db, Registry::new().with(flow()));
    let rx = Receiver::start("").await;
    let new = onramp::engine::NewSubscription {
        url: rx.url.clone(),
        tenant: None,
        events: vec!["job.pending".parse().unwrap(), "job.cancelled".parse().unwrap()],
        created_by: "test".into(),
    };
    let (_, secret) = engine.create_subscription(&new).await.unwrap();
    rx.trust(secret.expose());
    // three dispatchers, as three worker replicas would run them
    let stop = CancellationToken::new();
    let replicas: Vec<_> = (0..3)
        .map(|i| {
            let (e, s) = (engine.clone(), stop.clone());
            let cfg = CallbackConfig { worker: format!("w{i}"), ..fast() };
            tokio::spawn(async move { e.run_callbacks(cfg, s).await })
        })
        .collect();
    let at = time::OffsetDateTime::now_utc() + time::Duration::hours(1);
    let mut want = vec![];
    for n in 0..10 {
        let id = engine.enqueue(&[job(&format!("foo/u{n}"), "ok").at(at)]).await.unwrap()[0].id;
        engine.cancel(id, &Actor::cli("test"), None).await.unwrap();
        want.extend(event_ids(&engine, id, &[JobState::Pending, JobState::Cancelled]).await);
    }
    rx.wait_for(&want).await;
    let got = rx.got();
    let ids: Vec<&str> = got.iter().map(|r| r["webhook_id"].as_str().unwrap()).collect();
    let expected: Vec<String> = want.iter().map(|id| format!("evt_{id}")).collect();
    assert_eq!(ids, expected, "each event once, in order, whichever replica sent it");
    assert!(got.iter().all(|r| r["verified"] == true));
    stop.cancel();
    for r in replicas {
        r.await.unwrap();
    }
}

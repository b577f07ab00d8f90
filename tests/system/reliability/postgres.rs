//! Scenario 2 of issue 17, PostgreSQL restarted during a burst: signed webhooks for the users of
//! the world's tenants are sent at a steady pace while the world's own PostgreSQL is stopped for
//! a few seconds and started again, twice (`pg_ctl -m fast`, an operator's restart, then `-m
//! immediate`, a crash). Each delivery's sender resends it with the same id until it is
//! acknowledged (2xx), as Authentik's transport retries. Checked:
//! - `/readyz` answers 503 within a second of each stop, and 200 again by itself after the start;
//!   no onramp process is restarted, the workers LISTEN again by themselves;
//! - no acknowledged delivery is lost (each is in `webhook_deliveries` under its event's key);
//! - each delivery is accepted (202) once at most, every other answer to it is a duplicate (200)
//!   naming the same stored delivery, and none is stored twice;
//! - every user ends up onboarded exactly once (`onboarding::check`: associations, keys, homes,
//!   quotas, e-mails).
//!
//! CI: 24 users per tenant; `ONRAMP_RELIABILITY_FULL=1`: 500 per tenant (1,000 users).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::Value;

use super::{Figures, full};
use crate::world::cluster::{self, User};
use crate::world::postgres::Stop;
use crate::world::webhook::{self, Delivery};
use crate::world::{Options, SlurmVia, World, eventually};

/// A sender gives up (and the test fails) when a delivery is still not acknowledged after this.
const SENDER_DEADLINE: Duration = Duration::from_secs(120);
/// How long a sender waits for an answer before it gives up on the attempt: half the senders are
/// impatient, half wait as long as the api's request timeout. The intake holds a delivery while
/// it waits for a database connection, up to the pool's acquire timeout (10 s), then answers 503;
/// so an impatient sender resends while its first attempt may still be stored (the resend is
/// then a duplicate), and a patient one gets the 503 or a late 202.
const SENDER_TIMEOUTS: [Duration; 2] = [Duration::from_secs(5), Duration::from_secs(30)];
/// The outages, each (how, when after the burst's start, how long down): the first outlasts the
/// pool's acquire timeout.
const OUTAGES: [(Stop, Duration, Duration); 2] = [
    (Stop::Fast, Duration::from_secs(2), Duration::from_secs(12)),
    (Stop::Immediate, Duration::from_secs(16), Duration::from_secs(3)),
];
/// The burst is spread over this, so deliveries arrive before, during and between the outages.
const SPREAD: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgresql_restart_during_a_burst_loses_no_acknowledged_delivery() {
    let mut figures = Figures::new("postgres-restart");
    let per_tenant = if full() { 500 } else { 24 };
    let mut opts = Options::new(SlurmVia::KubeExec);
    opts.own_postgres = true;
    let mut w = World::start(opts).await;
    let users = cluster::users(&w.tenants, per_tenant);
    w.add_users(&users).await;

    // the burst, at a steady pace over SPREAD; the outages meanwhile
    let started = Instant::now();
    let deliveries = deliveries(&w, &users);
    let n = deliveries.len();
    let mut senders = tokio::task::JoinSet::new();
    let clients = SENDER_TIMEOUTS.map(|t| reqwest::Client::builder().timeout(t).build().unwrap());
    for (i, (d, delay)) in deliveries.into_iter().enumerate() {
        let at = started + SPREAD.mul_f64(i as f64 / n as f64) + delay;
        let http = clients[i % clients.len()].clone();
        senders.spawn(send_until_acknowledged(http, w.webhook_url(), d, at));
    }
    let readiness = Readiness::start(&w);
    let mut outages = vec![];
    for (how, at, down) in OUTAGES {
        tokio::time::sleep_until((started + at).into()).await; // the schedule, not a condition
        outages.push((how, outage(&w, &readiness, how, down).await));
    }
    let listen_again = Instant::now();
    eventually(Duration::from_secs(60), "both workers to LISTEN again", || async {
        (w.db.listeners().await >= w.workers.len() as i64).then_some(())
    })
    .await;
    let listen_ms = listen_again.elapsed().as_millis();
    readiness.stop();

    let mut sent = vec![];
    while let Some(s) = senders.join_next().await {
        sent.push(s.unwrap());
    }
    let answers = check_answers(&sent);
    assert!(answers.retried > 0, "no sender had to resend: the outages missed the burst");
    let lost = check_stored(&w, &sent).await;

    w.wait_jobs("user.onboard", users.len(), Duration::from_secs(if full() { 1200 } else { 300 })).await;
    crate::onboarding::check(&w, &users).await;
    // the test restarted no onramp process, and none exited by itself
    for p in std::iter::once(&mut w.api).chain(&mut w.workers) {
        assert!(p.exited().is_none(), "{} exited:\n{}", p.name, p.tail(20));
    }
    let jobs: BTreeMap<String, i64> = sqlx::query_as("select state, count(*) from jobs group by state")
        .fetch_all(&w.db.pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert_eq!(jobs.keys().collect::<Vec<_>>(), ["succeeded"], "every job succeeded: {jobs:?}");

    figures.add("users", users.len());
    figures.add("deliveries", sent.len());
    figures.add("acknowledged_first_try", answers.first_try);
    figures.add("refused", answers.refused);
    figures.add("unanswered", answers.unanswered);
    figures.add("retried", answers.retried);
    figures.add("accepted", answers.accepted);
    figures.add("duplicates", answers.duplicates);
    figures.add("stored_unacknowledged", answers.stored_unacknowledged);
    figures.add("lost", lost);
    for (how, o) in &outages {
        figures.add(&format!("{how:?}_to_503_ms").to_lowercase(), o.to_503.as_millis());
        figures.add(&format!("{how:?}_back_ready_ms").to_lowercase(), o.back_ready.as_millis());
    }
    figures.add("workers_listen_ms", listen_ms);
    figures.add("jobs_succeeded", jobs["succeeded"]);
    // steps whose worker could not renew the lease or write the result while PostgreSQL was down
    let rerun: i64 = sqlx::query_scalar("select count(*) from step_runs where outcome = 'lease_expired'")
        .fetch_one(&w.db.pool)
        .await
        .unwrap();
    figures.add("steps_run_again", rerun);
    w.stop().await;
    figures.print();
}

/// The burst of `onboarding::burst`: "user created" per user, "members added" per tenant group,
/// and every tenth sent again shortly after (a sender's own retry), each with its delay.
fn deliveries(w: &World, users: &[User]) -> Vec<(Delivery, Duration)> {
    let mut ds: Vec<Delivery> =
        users.iter().map(|u| Delivery::new(&webhook::user_created(u.pk, &u.username))).collect();
    for t in &w.tenants {
        let pks: Vec<i64> = users.iter().filter(|u| u.tenant == t.name).map(|u| u.pk).collect();
        let group_pk = onramp_fakes::authentik::group_uuid(&t.group);
        ds.push(Delivery::new(&webhook::group_members_added(&group_pk, &t.group, &pks)));
    }
    let mut out = vec![];
    for (i, d) in ds.into_iter().enumerate() {
        if i % 10 == 0 {
            let again = Delivery { id: d.id.clone(), ts: d.ts, body: d.body.clone() };
            out.push((again, Duration::from_millis(300)));
        }
        out.push((d, Duration::ZERO));
    }
    out
}

/// What one attempt got.
#[derive(Debug, Clone, PartialEq)]
enum Answer {
    /// 202: stored now (the stored delivery's id).
    Accepted(String),
    /// 200: stored before (the id of the delivery stored first).
    Duplicate(String),
    /// Any other status: not acknowledged.
    Refused(u16),
    /// No answer (connection refused or reset, timed out).
    None,
}

impl Answer {
    fn acknowledged(&self) -> bool {
        matches!(self, Self::Accepted(_) | Self::Duplicate(_))
    }
}

struct Sent {
    webhook_id: String,
    /// `event:<event_uuid>`: the key the intake deduplicates on.
    key: String,
    answers: Vec<Answer>,
}

/// Sends `d` at `at`, then again after each unacknowledged attempt (250 ms apart, as a sender's
/// retry policy), until it is acknowledged.
async fn send_until_acknowledged(http: reqwest::Client, url: String, d: Delivery, at: Instant) -> Sent {
    tokio::time::sleep_until(at.into()).await;
    let body: Value = serde_json::from_slice(&d.body).unwrap();
    let key = format!("event:{}", body["event_uuid"].as_str().unwrap());
    let mut answers = vec![];
    let end = Instant::now() + SENDER_DEADLINE;
    loop {
        let a = match d.try_send(&http, &url).await {
            Ok((s, b)) if s == StatusCode::ACCEPTED && b["duplicate"] == false => Answer::Accepted(delivery(&b)),
            Ok((s, b)) if s == StatusCode::OK && b["duplicate"] == true => Answer::Duplicate(delivery(&b)),
            Ok((s, b)) => {
                assert!(!s.is_success(), "{}: an acknowledgement of an unknown form: {s} {b}", d.id);
                Answer::Refused(s.as_u16())
            }
            Err(_) => Answer::None,
        };
        let done = a.acknowledged();
        answers.push(a);
        if done {
            return Sent { webhook_id: d.id, key, answers };
        }
        assert!(Instant::now() < end, "{}: not acknowledged after {SENDER_DEADLINE:?}: {answers:?}", d.id);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

fn delivery(body: &Value) -> String {
    body["delivery"].as_str().unwrap_or_else(|| panic!("an acknowledgement without its delivery: {body}")).into()
}

#[derive(Default)]
struct Answers {
    first_try: usize,
    refused: usize,
    unanswered: usize,
    retried: usize,
    accepted: usize,
    duplicates: usize,
    /// Stored, but the attempt that stored it got no acknowledgement (PostgreSQL committed and
    /// went down before the answer): every later attempt is a duplicate.
    stored_unacknowledged: usize,
}

/// Each webhook id (its senders together) is accepted once at most; all its acknowledgements
/// name the same stored delivery; one accepted nowhere was stored by an unacknowledged attempt.
fn check_answers(sent: &[Sent]) -> Answers {
    let mut a = Answers::default();
    let mut by_id: BTreeMap<&str, Vec<&Answer>> = BTreeMap::new();
    for s in sent {
        let first = &s.answers[0];
        a.first_try += first.acknowledged() as usize;
        a.retried += (s.answers.len() > 1) as usize;
        for x in &s.answers {
            match x {
                Answer::Accepted(_) => a.accepted += 1,
                Answer::Duplicate(_) => a.duplicates += 1,
                Answer::Refused(_) => a.refused += 1,
                Answer::None => a.unanswered += 1,
            }
        }
        by_id.entry(&s.webhook_id).or_default().extend(&s.answers);
    }
    for (id, answers) in &by_id {
        let accepted = answers.iter().filter(|x| matches!(x, Answer::Accepted(_))).count();
        assert!(accepted <= 1, "{id} accepted {accepted} times: {answers:?}");
        let stored: BTreeSet<&String> = answers
            .iter()
            .filter_map(|x| match x {
                Answer::Accepted(d) | Answer::Duplicate(d) => Some(d),
                _ => None,
            })
            .collect();
        assert_eq!(stored.len(), 1, "{id}: its acknowledgements name other deliveries: {answers:?}");
        if accepted == 0 {
            let failed = answers.iter().any(|x| !x.acknowledged());
            assert!(failed, "{id}: a duplicate of nothing sent before: {answers:?}");
            a.stored_unacknowledged += 1;
        }
    }
    a
}

/// Every acknowledged delivery is in `webhook_deliveries` under its event's key, once; nothing
/// else is. Returns how many were lost (the assertions make that 0).
async fn check_stored(w: &World, sent: &[Sent]) -> usize {
    let rows: Vec<(uuid::Uuid, String)> =
        sqlx::query_as("select id, delivery_key from webhook_deliveries").fetch_all(&w.db.pool).await.unwrap();
    let stored: BTreeMap<String, String> = rows.iter().map(|(id, key)| (id.to_string(), key.clone())).collect();
    let mut acknowledged: BTreeMap<String, &str> = BTreeMap::new();
    for s in sent {
        for x in &s.answers {
            if let Answer::Accepted(d) | Answer::Duplicate(d) = x {
                acknowledged.insert(d.clone(), &s.key);
            }
        }
    }
    let lost: Vec<_> =
        acknowledged.iter().filter(|(d, key)| stored.get(*d).map(String::as_str) != Some(**key)).collect();
    assert!(lost.is_empty(), "acknowledged deliveries not stored under their key: {lost:?}");
    let keys: BTreeSet<&str> = sent.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(rows.len(), keys.len(), "stored deliveries, one per event sent");
    lost.len()
}

/// `/readyz` of the api asked over and over (25 ms apart): when each answer came and what it was.
struct Readiness {
    answers: Arc<Mutex<Vec<(Instant, u16)>>>,
    stop: Arc<AtomicBool>,
}

impl Readiness {
    fn start(w: &World) -> Self {
        let (answers, stop) = (Arc::new(Mutex::new(vec![])), Arc::new(AtomicBool::new(false)));
        let (a, s) = (answers.clone(), stop.clone());
        let (http, url) = (w.http.clone(), format!("{}/readyz", w.api_url));
        tokio::spawn(async move {
            while !s.load(Relaxed) {
                let r = http.get(&url).timeout(Duration::from_secs(5)).send().await;
                let status = r.map(|r| r.status().as_u16()).unwrap_or(0);
                a.lock().unwrap().push((Instant::now(), status));
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        });
        Self { answers, stop }
    }

    /// The first answer `status` that came after `since`.
    fn first(&self, status: u16, since: Instant) -> Option<Instant> {
        self.answers.lock().unwrap().iter().find(|(t, s)| *t >= since && *s == status).map(|(t, _)| *t)
    }

    /// The answers that came between `from` and `to`.
    fn between(&self, from: Instant, to: Instant) -> Vec<u16> {
        self.answers.lock().unwrap().iter().filter(|(t, _)| *t >= from && *t <= to).map(|(_, s)| *s).collect()
    }

    fn stop(&self) {
        self.stop.store(true, Relaxed);
    }
}

struct Outage {
    /// From the stop command to the first 503.
    to_503: Duration,
    /// From the start (the server accepting connections again) to the first 200.
    back_ready: Duration,
}

/// Stops the world's PostgreSQL for `down`, and starts it again.
async fn outage(w: &World, readiness: &Readiness, how: Stop, down: Duration) -> Outage {
    let stopping = Instant::now();
    w.db.stop(how).await;
    let to_503 = eventually(Duration::from_secs(10), "/readyz to answer 503 after the stop", || async {
        readiness.first(503, stopping).map(|t| t - stopping)
    })
    .await;
    assert!(to_503 <= Duration::from_secs(1), "/readyz answered 503 only {to_503:?} after the stop ({how:?})");
    tokio::time::sleep(down.saturating_sub(stopping.elapsed())).await; // the outage's length, not a condition
    let starting = Instant::now();
    let down = readiness.between(stopping + to_503, starting);
    assert!(down.iter().all(|s| *s == 503), "/readyz while PostgreSQL was down ({how:?}): {down:?}");
    w.db.start().await;
    let started = Instant::now();
    let back_ready = eventually(Duration::from_secs(30), "/readyz to answer 200 after the start", || async {
        readiness.first(200, started).map(|t| t - started)
    })
    .await;
    Outage { to_503, back_ready }
}

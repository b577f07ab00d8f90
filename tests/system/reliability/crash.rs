//! Scenario 1, crash under load, whole flows (and scenario 5, every process doubled): signed
//! webhooks for the users of three tenants, two worker replicas; `kill -9` of a worker (and once
//! of the api) at moments spread over the intake, running steps, Slurm batches, the propagation
//! timer and an offboarding's retention, each replica started again. Afterwards every effect is
//! counted outside onramp: each acknowledged delivery stored, each user with exactly one
//! association with the tenant's limits, key, home and smoke test done once, one welcome e-mail,
//! the offboarded users gone from Slurm, every job succeeded, Slurm writes one at a time.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::chaos::{Kills, Moment};
use super::{Figures, full, whose};
use crate::onboarding;
use crate::world::cluster::{self, User};
use crate::world::sender::{self, Outcome, Progress};
use crate::world::trace::SacctmgrTrace;
use crate::world::webhook::{self, Delivery};
use crate::world::{Options, SlurmVia, World, eventually};

struct Size {
    per_tenant: usize,
    kills: usize,
    offboard: usize,
}

impl Size {
    /// Scenario 1: 1,000 users and 20 kills in the long mode.
    fn crash() -> Self {
        if full() {
            Size { per_tenant: 334, kills: 20, offboard: 30 }
        } else {
            Size { per_tenant: 20, kills: 10, offboard: 6 }
        }
    }

    /// Scenario 5: half of scenario 1 (with enough kills for every kind of moment).
    fn replicas() -> Self {
        if full() {
            Size { per_tenant: 167, kills: 10, offboard: 15 }
        } else {
            Size { per_tenant: 20, kills: 7, offboard: 6 }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_acknowledged_event_is_carried_out_once_across_kill_9s() {
    run("crash", Options::new(SlurmVia::Local), Size::crash()).await;
}

/// Two replicas of everything for half of scenario 1: no step of one subject runs twice at once,
/// Slurm writes stay one at a time across the replicas and none is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_of_everything() {
    let mut opts = Options::new(SlurmVia::Local);
    opts.apis = 2;
    run("replicas", opts, Size::replicas()).await;
}

async fn run(scenario: &'static str, mut opts: Options, size: Size) {
    let traced = tempfile::Builder::new().prefix("onramp-trace-").tempdir().unwrap();
    let (trace, settings) = SacctmgrTrace::install(traced.path());
    opts.settings.extend(settings);
    opts.tenants = 3;
    // timers long enough to be killed in; the lease short enough to recover quickly
    for (k, v) in [("ONRAMP_PROPAGATION_WAIT", "4s"), ("ONRAMP_RETENTION", "30s"), ("ONRAMP_LEASE", "4s")] {
        opts.settings.insert(k.into(), v.into());
    }
    let mut w = World::start(opts).await;
    let mut figures = Figures::new(scenario);
    let users = cluster::users(&w.tenants, size.per_tenant);
    w.add_users(&users).await;

    // onboarding: the deliveries arrive paced over a few seconds, while replicas are killed
    let deliveries = onboarding::deliveries(&w, &users);
    let total = deliveries.len();
    let events: BTreeMap<String, String> = deliveries.iter().map(|d| (d.id.clone(), d.event_uuid())).collect();
    let progress = Arc::new(Progress::default());
    let sending = {
        let (http, urls, p) = (w.http.clone(), w.api_urls(), progress.clone());
        // paced over about ten seconds (as Authentik's workers send), so kills land mid-intake
        let pace = Duration::from_secs(10) / total as u32;
        tokio::spawn(sender::deliver_all(http, urls, deliveries, 8, pace, Duration::from_secs(120), p))
    };
    let mut kills = Kills::new(trace.clone());
    for kind in [Moment::IntakeWorker, Moment::IntakeApi] {
        kills.must(&mut w, &[kind], &progress, total).await;
    }
    // then while onboardings run, the kind killed least so far first; what is left when they
    // are all through is killed during the offboardings
    let onboarding = [Moment::MidBatch, Moment::PropagationTimer, Moment::MidStep];
    let phase = size.kills - size.kills / 3;
    while kills.total() < phase {
        if full() {
            // spread over the associations being made (the Slurm batches; with hundreds of
            // slots per worker they are all made long before the first onboarding succeeds):
            // the i-th of n once i/(n+1) of them are
            let (i, n) = (kills.total() - 2, phase - 2);
            associations_made(&w, users.len() * i / (n + 1)).await;
        }
        let each = Duration::from_secs(5);
        if kills.least_first(&mut w, &onboarding, &progress, total, each).await.is_none() {
            break;
        }
    }
    let outcomes = sending.await.unwrap();
    w.wait_jobs("user.onboard", users.len(), Duration::from_secs(900)).await;

    // offboarding of a few users of each tenant, killed during retention and mid-step
    let (leaving, staying) = split(&users, size.offboard);
    let off = offboard(&w, &leaving).await;
    while kills.total() < size.kills {
        let each = Duration::from_secs(10);
        let m = kills.least_first(&mut w, &[Moment::Retention, Moment::MidStep], &off, 0, each).await;
        assert!(m.is_some(), "no moment to kill at during the offboardings: {:?}", kills.by_moment);
    }
    // at CI sizes a run has few batches, and a kill may miss them all: then only the long mode
    // insists (the figures say how many there were)
    let optional = |m: &Moment| *m == Moment::MidBatch && !full();
    let missing: Vec<_> = Moment::ALL.iter().filter(|m| !kills.by_moment.contains_key(m) && !optional(m)).collect();
    w.wait_jobs("user.offboard", leaving.len(), Duration::from_secs(300)).await;

    // the effects are checked even when a moment was missed, then the missed moment fails the run
    check(&w, &outcomes, &events, &staying, &leaving, &trace, &mut figures).await;
    assert!(missing.is_empty(), "no kill at {missing:?}: {:?}", kills.by_moment);
    figures.add("kills", kills.total());
    for (m, n) in &kills.by_moment {
        figures.add(&format!("{m:?}"), n);
    }
    figures.add("users", users.len());
    figures.add("offboarded", leaving.len());
    figures.print();
    w.stop().await;
}

/// The first `n` users of each tenant leave; the rest stay.
fn split(users: &[User], n: usize) -> (Vec<User>, Vec<User>) {
    let per_tenant = n.div_ceil(3);
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    users.iter().cloned().partition(|u| {
        let k = seen.entry(u.tenant).or_default();
        *k += 1;
        *k <= per_tenant
    })
}

/// The users leave their groups in Authentik; a "members removed" delivery per tenant.
async fn offboard(w: &World, leaving: &[User]) -> Arc<Progress> {
    let gone: Vec<_> = leaving.iter().map(|u| User { groups: vec![], ..u.clone() }.fake()).collect();
    w.authentik.add_users(&gone).await.unwrap();
    let mut deliveries = vec![];
    for t in &w.tenants {
        let pks: Vec<i64> = leaving.iter().filter(|u| u.tenant == t.name).map(|u| u.pk).collect();
        let group_pk = onramp_fakes::authentik::group_uuid(&t.group);
        deliveries.push(Delivery::new(&webhook::group_members_removed(&group_pk, &t.group, &pks)));
    }
    let p = Arc::new(Progress::default());
    sender::deliver_all(
        w.http.clone(),
        w.api_urls(),
        deliveries,
        4,
        Duration::ZERO,
        Duration::from_secs(60),
        p.clone(),
    )
    .await;
    p
}

async fn check(
    w: &World,
    outcomes: &[(String, Outcome)],
    events: &BTreeMap<String, String>,
    staying: &[User],
    leaving: &[User],
    trace: &SacctmgrTrace,
    f: &mut Figures,
) {
    // every acknowledged delivery is stored, once; of two copies of one, the second was answered
    // as a duplicate
    let stored: Vec<String> =
        sqlx::query_scalar("select body->>'event_uuid' from webhook_deliveries").fetch_all(&w.db.pool).await.unwrap();
    let stored_once: BTreeSet<&String> = stored.iter().collect();
    assert_eq!(stored_once.len(), stored.len(), "an event stored twice");
    let lost: Vec<&String> = outcomes.iter().map(|(id, _)| &events[id]).filter(|e| !stored_once.contains(e)).collect();
    assert!(lost.is_empty(), "acknowledged and not stored: {lost:?}");
    let new: BTreeMap<&String, usize> =
        outcomes.iter().filter(|(_, o)| !o.duplicate).fold(BTreeMap::new(), |mut m, (id, _)| {
            *m.entry(id).or_default() += 1;
            m
        });
    assert!(new.values().all(|n| *n == 1), "an event accepted as new twice");
    f.add("deliveries_acknowledged", outcomes.len());
    f.add("events_stored", stored.len());
    f.add("lost", lost.len());
    f.add("resent_after_no_answer", outcomes.iter().filter(|(_, o)| o.refused > 0).count());
    f.add("answered_duplicate", outcomes.iter().filter(|(_, o)| o.duplicate).count());

    // every job succeeded: nothing failed, waits for a person, or was cancelled
    let states: Vec<(String, String, i64)> =
        sqlx::query_as("select kind, state, count(*) from jobs group by kind, state order by kind, state")
            .fetch_all(&w.db.pool)
            .await
            .unwrap();
    let bad: Vec<_> = states.iter().filter(|(_, s, _)| s != "succeeded").collect();
    assert!(bad.is_empty(), "jobs not succeeded: {bad:?}\n{}", w.diagnosis().await);
    f.add("jobs_succeeded", states.iter().map(|(_, _, n)| n).sum::<i64>());

    // the users who stay: onboarded once (associations, keys, homes, quotas, e-mails)
    let onboarded: Vec<String> =
        w.db.inputs("user.onboard", "succeeded")
            .await
            .iter()
            .map(|i| i["username"].as_str().unwrap().to_string())
            .collect();
    let once: BTreeSet<&String> = onboarded.iter().collect();
    assert_eq!(once.len(), onboarded.len(), "a user was onboarded by two jobs");
    assert_eq!(onboarded.len(), staying.len() + leaving.len());
    let missing = whose::missing(w, staying);
    assert!(missing.is_empty(), "staying users without an association:\n{}", whose::report(w, &missing, trace).await);
    onboarding::check_associations(w, staying);
    onboarding::check_keys(w, staying).await;
    onboarding::check_homes(w, staying).await;
    onboarding::check_quotas(w, staying);
    onboarding::check_mail(w, staying).await;
    f.add("associations_right", staying.len());
    let mails = onboarding::mail_by_user(w, staying);
    f.add("doubled_emails", mails.values().filter(|ids| ids.len() > 1).count());
    f.add("email_copies_sent_again", mails.values().flat_map(|ids| ids.values()).map(|n| n - 1).sum::<usize>());
    let everyone: Vec<&User> = staying.iter().chain(leaving).collect();
    let smoke = smoke_tests(w, &everyone).await;
    let interrupted: BTreeSet<String> = w.db.interrupted("smoke_test").await.into_iter().collect();
    for u in &everyone {
        let n = smoke.get(&u.username).copied().unwrap_or(0);
        let allowed = if interrupted.contains(&u.username) { 1..=2 } else { 1..=1 };
        assert!(allowed.contains(&n), "{}: {n} smoke tests", u.username);
    }
    f.add("smoke_tests_twice_after_a_kill_in_them", smoke.values().filter(|n| **n > 1).count());

    // the users who left: no association left under the world's accounts (checked above), each
    // offboarding's archive written before the delete
    let archived: i64 = sqlx::query_scalar(
        "select count(*) from jobs where kind = 'user.offboard' and state = 'succeeded'
         and (outputs->'archive'->'export'->>'rows') is not null and (outputs->'delete'->>'deleted')::boolean",
    )
    .fetch_one(&w.db.pool)
    .await
    .unwrap();
    assert_eq!(archived as usize, leaving.len(), "offboardings that archived, then deleted");

    // Slurm writes one at a time across replicas, also after a kill -9 mid-write
    let (overlaps, writes) = trace.overlapping_writes();
    f.add("slurm_writes", writes);
    let batches = trace
        .calls()
        .iter()
        .filter(|c| c.argv.windows(3).any(|a| a[0] == "add" && a[1] == "user" && a[2].contains(',')))
        .count();
    f.add("slurm_batches", batches);
    f.add("slurm_writes_overlapping", overlaps.len());
    assert!(overlaps.is_empty(), "Slurm writes at the same time: {overlaps:#?}");
    let concurrent = concurrent_steps(w).await;
    f.add("steps_of_one_subject_at_once", concurrent.len());
    assert!(concurrent.is_empty(), "steps of one subject ran at once: {concurrent:?}");
}

/// Smoke-test jobs that ran to completion, by user, as Slurm's accounting has them (`sacct`, the
/// jobs named `onramp-smoke-job<id>-<created>`): the truth, whatever the exec that started one saw.
/// Read until every one of `users` has one (accounting learns of a job's end a moment later); on
/// timeout, says whose are missing and what their smoke steps recorded.
async fn smoke_tests(w: &World, users: &[&User]) -> BTreeMap<String, usize> {
    let end = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let out = cluster::run(&["sacct", "-n", "-P", "-X", "-a", "-S", &w.started, "--format=JobName,User,State"]);
        let mut n = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let f: Vec<&str> = line.split('|').collect();
            if let [name, user, state] = f[..]
                && name.starts_with("onramp-smoke-job")
                && state.starts_with("COMPLETED")
            {
                *n.entry(user.to_string()).or_default() += 1;
            }
        }
        let missing: Vec<String> =
            users.iter().filter(|u| !n.contains_key(&u.username)).map(|u| u.username.clone()).collect();
        if missing.is_empty() {
            return n;
        }
        if tokio::time::Instant::now() >= end {
            let steps: Vec<String> = sqlx::query_scalar(
                "select format('%s job %s attempt %s: %s %s %s', j.input->>'username', j.id, s.attempt, s.outcome,
                               s.error, s.output) from step_runs s
                 join jobs j on j.id = s.job_id where s.step = 'smoke_test' and j.input->>'username' = any($1)
                 order by j.id, s.attempt",
            )
            .bind(&missing)
            .fetch_all(&w.db.pool)
            .await
            .unwrap();
            panic!("after 60s no completed smoke job in sacct for {missing:?}; their smoke steps: {steps:#?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Pairs of step runs of one subject whose times overlap (runs cut short by a kill excluded: they
/// ended when their worker died, which the database cannot know).
async fn concurrent_steps(w: &World) -> Vec<(String, i64, i64)> {
    sqlx::query_as(
        "select j1.subject, r1.id, r2.id from step_runs r1 join jobs j1 on j1.id = r1.job_id
         join step_runs r2 on r2.id > r1.id join jobs j2 on j2.id = r2.job_id and j2.subject = j1.subject
         where r1.finished_at is not null and r2.finished_at is not null
           and r1.outcome <> 'lease_expired' and r2.outcome <> 'lease_expired'
           and r2.started_at < r1.finished_at and r1.started_at < r2.finished_at
         limit 10",
    )
    .fetch_all(&w.db.pool)
    .await
    .unwrap()
}

/// Polls until `n` onboardings have made their association (finished `slurm_association`).
async fn associations_made(w: &World, n: usize) {
    eventually(Duration::from_secs(900), "associations made", || async {
        let done: i64 = sqlx::query_scalar(
            "select count(distinct job_id) from step_runs where step = 'slurm_association' and outcome = 'done'",
        )
        .fetch_one(&w.db.pool)
        .await
        .unwrap();
        (done as usize >= n).then_some(())
    })
    .await;
}

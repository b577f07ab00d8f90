//! The end-to-end onboarding benchmark: the users of one tenant are added to its group, one
//! signed "members added" webhook each, at the shipped binary (api and two workers, Slurm on this
//! host). Two figures, on PostgreSQL's clock from just before the first delivery: until every
//! association exists and was verified by reading back (each onboarding's `slurm_association`
//! step done), and until every onboarding job succeeded. The reference in the same run: the
//! runbook's one `sacctmgr add user` per user, timed on 50 users and extrapolated.
//!
//! `ONRAMP_BENCH_USERS` users (default 30: CI's smoke, which asserts the results and no speed;
//! `bench/run.sh` runs 1,000). The figure is printed as a JSON line only when the run checked out:
//! every job succeeded and every association is present (independent `sacctmgr show assoc`).
//! The propagation wait is set to 0 s: it is a configured pause for the key to reach the login
//! pods, not work. `ONRAMP_BENCH_WORKER_CONCURRENCY` and `ONRAMP_BENCH_STORAGE_CONCURRENCY`, when
//! set, become the service's `ONRAMP_WORKER_CONCURRENCY` and `ONRAMP_STORAGE_CONCURRENCY` (both
//! are printed in the JSON line, `"default"` when unset).

use std::time::{Duration, Instant};

use crate::onboarding;
use crate::world::cluster;
use crate::world::sender::{self, Progress};
use crate::world::webhook::{self, Delivery};
use crate::world::{Options, SlurmVia, World, eventually};

fn users() -> usize {
    std::env::var("ONRAMP_BENCH_USERS").ok().and_then(|n| n.parse().ok()).unwrap_or(30)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bulk_onboarding_through_the_service() {
    let mut opts = Options::new(SlurmVia::Local);
    opts.tenants = 1;
    opts.settings.insert("ONRAMP_PROPAGATION_WAIT".into(), "0s".into());
    opts.settings.insert("ONRAMP_LOG".into(), "warn".into());
    let concurrency = pass_through(&mut opts, "ONRAMP_BENCH_WORKER_CONCURRENCY", "ONRAMP_WORKER_CONCURRENCY");
    let storage = pass_through(&mut opts, "ONRAMP_BENCH_STORAGE_CONCURRENCY", "ONRAMP_STORAGE_CONCURRENCY");
    let mut w = World::start(opts).await;
    let n = users();
    let users = cluster::users(&w.tenants, n);
    w.add_users(&users).await;
    let t = &w.tenants[0];
    let group_pk = onramp_fakes::authentik::group_uuid(&t.group);
    let deliveries: Vec<Delivery> =
        users.iter().map(|u| Delivery::new(&webhook::group_members_added(&group_pk, &t.group, &[u.pk]))).collect();

    let t0: time::OffsetDateTime = sqlx::query_scalar("select clock_timestamp()").fetch_one(&w.db.pool).await.unwrap();
    let outcomes = sender::deliver_all(
        w.http.clone(),
        w.api_urls(),
        deliveries,
        32,
        Duration::ZERO,
        Duration::from_secs(60),
        std::sync::Arc::new(Progress::default()),
    )
    .await;
    assert_eq!(outcomes.len(), n, "every delivery acknowledged");
    let deadline = Duration::from_secs(120 + n as u64);
    let verified = eventually(deadline, "every association verified", || async {
        let (done, last): (i64, Option<time::OffsetDateTime>) = sqlx::query_as(
            "select count(distinct job_id), max(finished_at) from step_runs
             where step = 'slurm_association' and outcome = 'done'",
        )
        .fetch_one(&w.db.pool)
        .await
        .unwrap();
        (done as usize == n).then_some(last)
    })
    .await;
    w.wait_jobs("user.onboard", n, deadline).await;
    let succeeded: Option<time::OffsetDateTime> = sqlx::query_scalar(
        "select max(e.at) from job_events e join jobs j on j.id = e.job_id
         where j.kind = 'user.onboard' and e.to_state = 'succeeded'",
    )
    .fetch_one(&w.db.pool)
    .await
    .unwrap();
    // the harness checks its own result before it says a figure
    onboarding::check_associations(&w, &users);
    let states = w.db.states("user.onboard").await;
    assert_eq!(states.get("succeeded").copied().unwrap_or(0) as usize, n, "{states:?}");
    let adds = batches(&w).await;
    let timeline = timeline(&w, t0).await;
    let reference = one_by_one(&t.account, 50);
    w.stop().await;

    let secs = |at: Option<time::OffsetDateTime>| (at.expect("a time") - t0).as_seconds_f64();
    let (assoc_s, jobs_s) = (secs(verified), secs(succeeded));
    let runbook_s = reference.as_secs_f64() / 50.0 * n as f64;
    println!(
        "{}",
        serde_json::json!({
            "system": "onramp", "measure": "bulk_onboarding", "users": n,
            "worker_concurrency": concurrency, "storage_concurrency": storage,
            "associations_verified_s": assoc_s, "onboardings_succeeded_s": jobs_s,
            "runbook_one_by_one_s": runbook_s, "runbook_measured_on": 50,
            "speedup": runbook_s / assoc_s, "sacctmgr_add_user_calls": adds, "steps": timeline,
        })
    );
}

/// The bench's variable `from`, when set, as the service's setting `to`; what the service runs
/// with, for the JSON line.
fn pass_through(opts: &mut Options, from: &str, to: &str) -> String {
    match std::env::var(from) {
        Ok(v) => {
            opts.settings.insert(to.into(), v.clone());
            v
        }
        Err(_) => "default".into(),
    }
}

/// How many `sacctmgr add user` calls onramp made: the commands the attempts recorded (every
/// member of a batch records the batch's one command).
async fn batches(w: &World) -> i64 {
    sqlx::query_scalar(
        "select count(distinct e->>'call') from step_runs, jsonb_array_elements(effects) e
         where step = 'slurm_association' and e->>'call' like 'sacctmgr -i add user %'",
    )
    .fetch_one(&w.db.pool)
    .await
    .unwrap()
}

/// Where the time went, per step of every job: attempts, when the first started and the last
/// finished (seconds from the first delivery), the median and 95th percentile of an attempt, and
/// the attempts that did not finish their step, by outcome, with one of their errors.
async fn timeline(w: &World, t0: time::OffsetDateTime) -> serde_json::Value {
    let rows: Vec<(String, String, i64, f64, f64, f64, f64)> = sqlx::query_as(
        "select j.kind, s.step, count(*),
                extract(epoch from min(s.started_at) - $1)::float8,
                extract(epoch from max(s.finished_at) - $1)::float8,
                (percentile_cont(0.5) within group (order by extract(epoch from s.finished_at - s.started_at)))::float8,
                (percentile_cont(0.95) within group (order by extract(epoch from s.finished_at - s.started_at)))::float8
         from step_runs s join jobs j on j.id = s.job_id
         group by j.kind, s.step order by 4",
    )
    .bind(t0)
    .fetch_all(&w.db.pool)
    .await
    .unwrap();
    // attempts that did not finish the step: how many of each outcome, and one error of each
    let others: Vec<(String, String, String, i64, Option<String>)> = sqlx::query_as(
        "select j.kind, s.step, coalesce(s.outcome, 'unfinished'), count(*), min(left(s.error, 300))
         from step_runs s join jobs j on j.id = s.job_id
         where s.outcome is distinct from 'done' group by 1, 2, 3",
    )
    .fetch_all(&w.db.pool)
    .await
    .unwrap();
    let round = |x: f64| (x * 1000.0).round() / 1000.0;
    rows.into_iter()
        .map(|(kind, step, n, first, last, p50, p95)| {
            let not_done: serde_json::Map<String, serde_json::Value> = others
                .iter()
                .filter(|o| o.0 == kind && o.1 == step)
                .map(|(_, _, outcome, n, error)| (outcome.clone(), serde_json::json!({ "n": n, "an_error": error })))
                .collect();
            serde_json::json!({ "step": format!("{kind}/{step}"), "attempts": n, "first_started_s": round(first),
                                "last_finished_s": round(last), "p50_s": round(p50), "p95_s": round(p95),
                                "not_done": not_done })
        })
        .collect()
}

/// The runbook's way: one `sacctmgr -i add user` per user, timed on `n` users (removed after).
fn one_by_one(account: &str, n: usize) -> Duration {
    let names: Vec<String> = (0..n).map(|i| format!("{}-ref-{i:03}", cluster::PREFIX)).collect();
    let started = Instant::now();
    for name in &names {
        let (a, d) = (format!("Account={account}"), format!("DefaultAccount={account}"));
        let argv =
            ["sacctmgr", "-i", "add", "user", name, &a, &d, "Fairshare=parent", "DefaultQOS=normal", "qos=normal"];
        let out = cluster::run(&[&argv[..], &["MaxJobs=20"]].concat());
        assert!(out.status.success(), "{argv:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let took = started.elapsed();
    let assocs = cluster::assocs(&[account]);
    let made = names.iter().filter(|n| assocs.iter().any(|a| &a.user == *n)).count();
    cluster::run(&["sacctmgr", "-i", "delete", "user", "where", &format!("name={}", names.join(","))]);
    assert_eq!(made, n, "the reference's users were all added");
    took
}

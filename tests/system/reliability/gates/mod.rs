//! Scenario 4, "Gates and order": on the deployed world (api and workers as processes), the gates
//! between an offboarding's steps hold when something outside onramp goes wrong.
//!
//! 1. Archive: users offboarded through `POST /v1/jobs` as an operator does it. While their
//!    delete steps cannot yet run (Authentik answers 503 for a while, so each delete step retries
//!    after the archive step ended), one user's export is replaced by an empty file and another's
//!    deleted by hand: neither delete runs, the jobs fail naming the archive, the associations
//!    stay. A third user's export first comes out empty (its temporary file is a link to
//!    /dev/null): the archive step retries until the export holds the records, and only then is
//!    that user deleted (the control: the same window lets an intact archive through). A fourth
//!    user's `$HOME` snapshot is deleted by hand in the window: no delete either.
//! 2. Brake: Authentik suddenly lists no members in any tenant group; the reconcile an operator
//!    starts (`POST /v1/jobs reconcile.full`) holds every offboarding for a person's approval,
//!    touching no association (read with `sacctmgr`).
//! 3. Re-added during retention: users removed from the group (webhook; one in the tenant's
//!    account, one in a team's) are blocked, their keys removed, and wait out retention; re-added
//!    (webhook), the offboardings are cancelled as superseded and the users restored: associations
//!    unblocked with their limits, keys back, `$HOME` and its data as they were, nothing of
//!    theirs deleted or snapshotted.
//!
//! Users per tenant: 8 (`ONRAMP_RELIABILITY_FULL=1`: 100, for a bigger brake pass).

use std::collections::BTreeSet;
use std::time::Duration;

use onramp_fakes::authentik::control::FailNext;
use serde_json::{Value, json};

mod read;

use self::read::{all_assocs, assoc_of, deletes_of, export_name, key_in_secret, snapshot_file};
use super::{Figures, full};
use crate::world::cluster::{self, User};
use crate::world::webhook::{self, Delivery};
use crate::world::{Options, SlurmVia, World, eventually};

/// Long enough for the test to act while an offboarding waits; short enough for CI.
const RETENTION: &str = "15s";
const T: Duration = Duration::from_secs(120);

fn per_tenant() -> usize {
    if full() { 100 } else { 8 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gates_hold_on_the_deployed_world() {
    let mut opts = Options::new(SlurmVia::KubeExec);
    for (k, v) in [
        ("ONRAMP_RETENTION", RETENTION),
        // reconciles run only when the test (a webhook, an operator) asks for one
        ("ONRAMP_RECONCILE_INTERVAL", "1h"),
        ("ONRAMP_BRAKE_MIN_USERS", "5"),
        ("ONRAMP_BRAKE_MAX_PERCENT", "10"),
        ("ONRAMP_BRAKE_WINDOW", "1h"),
    ] {
        opts.settings.insert(k.into(), v.into());
    }
    let mut w = World::start(opts).await;
    let users = cluster::users(&w.tenants, per_tenant());
    crate::onboarding::burst(&w, &users).await;
    w.wait_jobs("user.onboard", users.len(), Duration::from_secs(600)).await;
    let mut fig = Figures::new("gates");
    fig.add("users", users.len());
    let foo: Vec<&User> = users.iter().filter(|u| u.tenant == "foo").collect();

    // one after the other: the archive gate's Authentik outage must not meet the re-added
    // user's reconcile, and the brake pass comes last (it empties every group)
    re_added_during_retention(&w, &[foo[3], foo[6]], &mut fig).await;
    archive_gate(&w, [foo[0], foo[1], foo[2], foo[4]], &mut fig).await;
    brake_gate(&w, &users, &mut fig).await;
    fig.print();
    w.stop().await;
}

// ---- gate 3: re-added during retention

const DATA: &str = "epoch,loss\n1,0.5\n";

/// `users` (of one tenant) leave it and come back while their offboardings wait out retention.
async fn re_added_during_retention(w: &World, users: &[&User], fig: &mut Figures) {
    let mut before = vec![];
    for u in users {
        let data = w.path("home").join(&u.username).join("results.csv");
        std::fs::write(&data, DATA).unwrap();
        std::os::unix::fs::chown(&data, Some(u.uid()), Some(u.uid())).unwrap();
        before.push(assoc_of(u).expect("an association after onboarding"));
        set_groups(w, u, &[]).await;
    }
    // removed from the group, as Authentik's webhook tells it
    let group = tenant_group(w, users[0]);
    let pks: Vec<i64> = users.iter().map(|u| u.pk).collect();
    let group_pk = onramp_fakes::authentik::group_uuid(&group);
    send(w, &webhook::group_members_removed(&group_pk, &group, &pks)).await;
    let mut offs = vec![];
    for u in users {
        let waiting = |j: &Job| j.state == "waiting" && j.step == "retention";
        offs.push(wait_job(w, "user.offboard", u, "the offboarding to wait out retention", waiting).await);
        // it really offboarded so far: blocked, key gone
        assert_eq!(assoc_of(u).map(|a| a.blocked()), Some(true), "{} blocked during retention", u.username);
        assert!(!key_in_secret(w, u).await, "{}'s key is still in the Secret during retention", u.username);
    }

    // re-added (active again, back in their groups) before the retention ends
    let fakes: Vec<_> = users.iter().map(|u| u.fake()).collect();
    w.authentik.add_users(&fakes).await.unwrap();
    send(w, &webhook::group_members_added(&group_pk, &group, &pks)).await;
    let (mut deletes, mut snapshots) = (0, 0);
    let calls = || std::fs::read_to_string(w.path("storage/calls.jsonl")).unwrap_or_default();
    for ((u, off), before) in users.iter().zip(&offs).zip(&before) {
        let cancelled = eventually(T, "the offboarding to be cancelled", || async {
            let j = job(w, off.id).await;
            (j.state != "waiting").then_some(j)
        })
        .await;
        assert_eq!(cancelled.state, "cancelled", "{cancelled:?}");
        let why = cancel_reason(w, off.id).await;
        assert!(why.contains("active member again"), "the cancellation says why: {why:?}");
        let restore = wait_job(w, "user.onboard", u, "the restoring onboarding", |j| {
            j.id > off.id && matches!(j.state.as_str(), "succeeded" | "failed")
        })
        .await;
        assert_eq!(restore.state, "succeeded", "{restore:?}");

        assert_eq!(assoc_of(u).as_ref(), Some(before), "{}'s association unblocked with its limits", u.username);
        assert!(key_in_secret(w, u).await, "{}'s key is back in the Secret", u.username);
        let data = w.path("home").join(&u.username).join("results.csv");
        assert_eq!(std::fs::read_to_string(&data).unwrap(), DATA, "{} intact", data.display());
        let ran = steps_run(w, off.id).await;
        assert!(ran.iter().all(|s| !["snapshot_home", "archive", "delete"].contains(&s.as_str())), "{ran:?}");
        deletes += deletes_of(w, u).await;
        snapshots += calls().lines().filter(|l| l.contains("snapshot") && l.contains(&u.username)).count();
    }
    assert_eq!((deletes, snapshots), (0, 0), "deletes and snapshots of the re-added users");
    fig.add("readded_restored", format!("{0}/{0}", users.len()));
    fig.add("readded_deletes_attempted", deletes);
}

// ---- gate 1: the archive

/// `control`'s export first comes out empty; `emptied`'s is emptied and `removed`'s deleted, and
/// `unsnapped`'s snapshot deleted, by hand between the archive step and the delete step.
async fn archive_gate(w: &World, four: [&User; 4], fig: &mut Figures) {
    let [control, emptied, removed, unsnapped] = four;
    // the control's first export writes into /dev/null: it comes out empty
    let tmp = w.path("archive").join(format!("{}.tmp", export_name(control)));
    std::os::unix::fs::symlink("/dev/null", &tmp).unwrap();
    // an operator's offboarding: out of the group in Authentik, then the API
    for u in four {
        set_groups(w, u, &[]).await;
        let body = json!({"kind": "user.offboard", "tenant": u.tenant, "account": u.account,
                          "username": u.username, "hard_cutoff": false});
        let r = w.http.post(format!("{}/v1/jobs", w.api_url)).bearer_auth(&w.api_token).json(&body).send().await;
        let r = r.unwrap();
        assert_eq!(r.status().as_u16(), 202, "POST /v1/jobs {body}: {}", r.text().await.unwrap_or_default());
    }
    let mut jobs = vec![];
    for u in four {
        jobs.push(
            wait_job(w, "user.offboard", u, "the offboarding to wait out retention", |j| j.step == "retention").await,
        );
    }
    // Authentik is down from now until the test says: the delete steps (the next to ask it)
    // retry, which opens the window between the archive step and the delete step
    let outage: Vec<FailNext> = (0..5000).map(|_| FailNext { status: 503, retry_after: None }).collect();
    w.authentik.fail_next(&outage).await.unwrap();
    for j in &jobs {
        eventually(T, "the delete step to retry while Authentik is down", || async {
            let n: i64 = sqlx::query_scalar(
                "select count(*) from step_runs where job_id = $1 and step = 'delete' and outcome = 'retry'",
            )
            .bind(j.id)
            .fetch_one(&w.db.pool)
            .await
            .unwrap();
            (n > 0).then_some(())
        })
        .await;
    }
    let mut outputs = vec![];
    for j in &jobs {
        outputs.push(job(w, j.id).await.outputs);
    }
    let exports: Vec<&Value> = outputs.iter().map(|o| &o["archive"]["export"]).collect();
    for (u, x) in four.iter().zip(&exports) {
        assert!(x["rows"].as_u64().unwrap_or(0) >= 1, "{}'s export holds their records: {x}", u.username);
    }
    let path = |i: usize| exports[i]["path"].as_str().unwrap().to_string();
    // by hand, between the archive step and the delete step
    std::fs::write(path(1), b"").unwrap();
    std::fs::remove_file(path(2)).unwrap();
    let snapshot = outputs[3]["snapshot_home"]["snapshot"].as_str().unwrap().to_string();
    let unsnapped_file = snapshot_file(w, &snapshot).unwrap_or_else(|| panic!("no snapshot {snapshot} at the storage"));
    std::fs::remove_file(&unsnapped_file).unwrap();
    w.authentik.clear_faults().await.unwrap();

    let end: Vec<Job> = {
        let mut v = vec![];
        for j in &jobs {
            v.push(
                eventually(T, "the offboarding to end", || async {
                    let j = job(w, j.id).await;
                    matches!(j.state.as_str(), "succeeded" | "failed").then_some(j)
                })
                .await,
            );
        }
        v
    };
    // the control: an export that came out empty was retried, never passed on; then deleted
    assert_eq!(end[0].state, "succeeded", "{:?}", end[0]);
    let retried: Vec<String> = sqlx::query_scalar(
        "select coalesce(error, '') from step_runs where job_id = $1 and step = 'archive' and outcome = 'retry'",
    )
    .bind(end[0].id)
    .fetch_all(&w.db.pool)
    .await
    .unwrap();
    assert!(retried.iter().any(|e| e.contains("holds 0 rows, but sacct showed")), "{retried:?}");
    assert_eq!(end[0].outputs["delete"]["archive"]["rows"], exports[0]["rows"], "{}", end[0].outputs);
    assert!(assoc_of(control).is_none(), "the control {} was deleted", control.username);
    assert!(deletes_of(w, control).await >= 1, "the test sees a delete when there is one");

    // the tampered ones: refused, naming the archive; nothing deleted
    let want = [
        format!("the archive {} changed after the archive step", path(1)),
        format!("the archive {} is missing", path(2)),
        format!("the snapshot {snapshot} of {}'s $HOME was gone at the delete step", unsnapped.username),
    ];
    for ((j, u), want) in end[1..].iter().zip([emptied, removed, unsnapped]).zip(want) {
        assert_eq!((j.state.as_str(), j.step.as_str()), ("failed", "delete"), "{j:?}");
        let e = j.last_error.clone().unwrap_or_default();
        assert!(e.contains(&want) && e.contains("nothing was deleted"), "{}: {e}", u.username);
        assert_eq!(assoc_of(u).map(|a| a.blocked()), Some(true), "{}'s association is still there", u.username);
        assert_eq!(deletes_of(w, u).await, 0, "deletes attempted for {}", u.username);
    }
    assert!(end[1].last_error.as_deref().unwrap_or_default().contains("and 0 rows now"), "{:?}", end[1]);
    // the snapshot deleted by hand was taken again (for the person who retries the job)
    assert!(snapshot_file(w, &snapshot).is_some(), "{snapshot} taken again");
    fig.add("archive_or_snapshot_refused", "3/3");
    fig.add("archive_deletes_attempted", 0);
    fig.add("archive_associations_intact", "3/3");
    fig.add("empty_export_retried", retried.len());
}

// ---- gate 2: the brake

async fn brake_gate(w: &World, users: &[User], fig: &mut Figures) {
    let before = all_assocs(w);
    let offboards_before = count(w, "select count(*) from jobs where kind = 'user.offboard'").await;
    // every tenant group answers with no members
    let mut all = w.authentik.users().await.unwrap();
    for u in &mut all {
        u.groups.clear();
    }
    w.authentik.add_users(&all).await.unwrap();
    let body = json!({"kind": "reconcile.full"});
    let r = w.http.post(format!("{}/v1/jobs", w.api_url)).bearer_auth(&w.api_token).json(&body).send().await;
    let r: Value = r.unwrap().json().await.unwrap();
    let id = r["id"].as_i64().unwrap_or_else(|| panic!("{r}"));
    let pass = eventually(T, "the reconcile pass", || async {
        let j = job(w, id).await;
        matches!(j.state.as_str(), "succeeded" | "failed").then_some(j)
    })
    .await;
    assert_eq!(pass.state, "succeeded", "{pass:?}");
    // the pass enqueues; what it enqueued has settled once no reconcile job is left to run
    eventually(T, "the reconcile jobs to settle", || async {
        let open =
            count(w, "select count(*) from jobs where kind like 'reconcile.%' and state in ('pending', 'running')");
        (open.await == 0).then_some(())
    })
    .await;

    let started = count(w, "select count(*) from jobs where kind = 'user.offboard'").await - offboards_before;
    let after = all_assocs(w);
    let touched = before.symmetric_difference(&after).map(|a| a.user.clone()).collect::<BTreeSet<_>>().len();
    // each tenant loses all of its users at once: past the brake, so every one is held
    assert_eq!((started, touched), (0, 0), "offboardings started and associations touched by the empty pass");
    let holds = get(w, "/v1/jobs?kind=reconcile.hold").await;
    let holds = holds["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(holds.len(), 1, "one hold: {holds:?}");
    assert_eq!(holds[0]["state"], "needs_approval", "{}", holds[0]);
    let said = holds[0].to_string();
    assert!(said.contains("safety brake"), "the hold says why: {said}");
    let held: usize = pass_held(w, id).await;
    let with_assoc = before.iter().map(|a| a.user.clone()).collect::<BTreeSet<_>>().len();
    assert_eq!(held, with_assoc, "every user with an association is held");
    fig.add("brake_users_emptied", users.len());
    fig.add("brake_held", held);
    fig.add("brake_offboardings_started", started);
    fig.add("brake_associations_touched", touched);
}

/// How many offboardings the pass (and the tenant passes it started) held.
async fn pass_held(w: &World, full_id: i64) -> usize {
    let outs: Vec<Value> = sqlx::query_scalar(
        "select outputs from jobs where kind like 'reconcile.%' and id >= $1 and kind <> 'reconcile.hold'",
    )
    .bind(full_id)
    .fetch_all(&w.db.pool)
    .await
    .unwrap();
    let mut held = BTreeSet::new();
    for o in outs {
        for t in o["reconcile"]["tenants"].as_array().into_iter().flatten() {
            for h in t["held"].as_array().into_iter().flatten() {
                held.insert(h.to_string());
            }
        }
    }
    held.len()
}

// ---- what the gates read

#[derive(Clone, Debug)]
struct Job {
    id: i64,
    state: String,
    step: String,
    last_error: Option<String>,
    outputs: Value,
}

async fn job(w: &World, id: i64) -> Job {
    let (id, state, step, last_error, outputs) = sqlx::query_as::<_, (i64, String, String, Option<String>, Value)>(
        "select id, state, step, last_error, outputs from jobs where id = $1",
    )
    .bind(id)
    .fetch_one(&w.db.pool)
    .await
    .unwrap();
    Job { id, state, step, last_error, outputs }
}

/// Waits for the newest job of `kind` for the user to be as `ok` says.
async fn wait_job(w: &World, kind: &str, u: &User, what: &str, ok: impl Fn(&Job) -> bool) -> Job {
    eventually(T, &format!("{what} ({})", u.username), || async {
        let id: Option<i64> =
            sqlx::query_scalar("select max(id) from jobs where kind = $1 and input->>'username' = $2")
                .bind(kind)
                .bind(&u.username)
                .fetch_one(&w.db.pool)
                .await
                .unwrap();
        let j = job(w, id?).await;
        ok(&j).then_some(j)
    })
    .await
}

async fn steps_run(w: &World, id: i64) -> Vec<String> {
    sqlx::query_scalar("select distinct step from step_runs where job_id = $1")
        .bind(id)
        .fetch_all(&w.db.pool)
        .await
        .unwrap()
}

/// What the cancellation recorded as its reason (the job event's detail or the job's error).
async fn cancel_reason(w: &World, id: i64) -> String {
    let events: Vec<Value> =
        sqlx::query_scalar("select to_jsonb(e) from job_events e where job_id = $1 and to_state = 'cancelled'")
            .bind(id)
            .fetch_all(&w.db.pool)
            .await
            .unwrap();
    format!("{events:?} {:?}", job(w, id).await.last_error)
}

async fn count(w: &World, sql: &str) -> i64 {
    sqlx::query_scalar(sql).fetch_one(&w.db.pool).await.unwrap()
}

async fn get(w: &World, path: &str) -> Value {
    let r = w.http.get(format!("{}{path}", w.api_url)).bearer_auth(&w.api_token).send().await.unwrap();
    assert!(r.status().is_success(), "GET {path}: {}", r.status());
    r.json().await.unwrap()
}

async fn send(w: &World, body: &Value) {
    let status = Delivery::new(body).send(&w.http, &w.webhook_url()).await;
    assert!(status.is_success(), "the webhook answered {status}");
}

async fn set_groups(w: &World, u: &User, groups: &[&str]) {
    let mut f = u.fake();
    f.groups = groups.iter().map(|g| g.to_string()).collect();
    w.authentik.add_users(&[f]).await.unwrap();
}

fn tenant_group(w: &World, u: &User) -> String {
    w.tenants.iter().find(|t| t.name == u.tenant).unwrap().group.clone()
}

//! The dashboard in a real headless Chromium (Debian's chromium + chromium-driver): sign in, see
//! a job change state live with the reason for it and ticking ages, open a failed job through its
//! link, press retry, see it succeed; approvals by role, with a confirmation that names the effect
//! and errors that stay visible; the tenants overview after a reconcile; each tenant's users. Every
//! view is checked for horizontal scroll at 1,400 and 390 px, with screenshots saved to
//! target/dashboard-screenshots/*.png.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use onramp::engine::{Actor, FourEyes, JobFilter, NewJob, Registry, Transition};
use onramp::http::access::Role;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::engine_flows::Scripted;
use crate::http_api::token;

/// How long any wait here may take: generous, for a loaded CI machine running a browser per test
/// beside the whole suite (a wait ends as soon as its condition holds).
const PATIENCE: Duration = Duration::from_secs(30);

async fn chromedriver() -> (tokio::process::Child, String) {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromedriver (Debian: apt-get install chromium chromium-driver; scripts/test installs it)");
    let url = format!("http://127.0.0.1:{port}");
    let status = format!("{url}/status");
    eventually(PATIENCE, "chromedriver to answer", || async {
        reqwest::get(&status).await.ok().filter(|r| r.status().is_success()).map(|_| ())
    })
    .await;
    (child, url)
}

async fn browser(webdriver: &str) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": "/usr/bin/chromium",
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--disable-background-networking", "--disable-component-update", "--disable-sync",
                     "--no-first-run", "--disable-quic", "--window-size=1280,900"]
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector).capabilities(caps).connect(webdriver).await.expect("a Chromium session")
}

async fn text_of(c: &Client, css: &str) -> Option<String> {
    match c.find(Locator::Css(css)).await {
        Ok(e) => e.text().await.ok(),
        Err(_) => None,
    }
}

async fn present(c: &Client, css: &str) -> bool {
    !c.find_all(Locator::Css(css)).await.unwrap().is_empty()
}

/// Waits until the element's text satisfies `ok`, and returns it.
async fn text_when(c: &Client, css: &str, what: &str, ok: impl Fn(&str) -> bool) -> String {
    eventually(PATIENCE, &format!("{css} to read {what}"), || async { text_of(c, css).await.filter(|t| ok(t)) }).await
}

/// Clicks the element once it is there (again, should a live update redraw it meanwhile).
async fn click(c: &Client, css: &str) {
    eventually(PATIENCE, &format!("{css} to be clicked"), || async {
        c.find(Locator::Css(css)).await.ok()?.click().await.ok()
    })
    .await;
}

async fn reads(c: &Client, css: &str, want: &str) {
    text_when(c, css, want, |t| t == want).await;
}

/// Signs in with `tok` (as the login form keeps it: in the tab's sessionStorage) and opens `hash`.
async fn open_as(c: &Client, base: &str, tok: &str, hash: &str) {
    c.goto(&format!("{base}/dashboard")).await.unwrap();
    c.execute("sessionStorage.setItem('onramp-token', arguments[0])", vec![json!(tok)]).await.unwrap();
    c.goto(&format!("{base}/dashboard{hash}")).await.unwrap();
    c.refresh().await.unwrap();
}

const SIZES: [(u32, u32); 2] = [(1400, 900), (390, 844)];

/// At a desktop and a phone width: `ready` shows, the page has no horizontal scroll, and a
/// screenshot is saved as target/dashboard-screenshots/<name>-<width>.png. Ends at desktop size.
async fn fits(c: &Client, name: &str, ready: &str) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/dashboard-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    for (w, h) in SIZES.into_iter().chain([SIZES[0]]) {
        c.set_window_size(w, h).await.unwrap();
        let size = || async {
            let v = c.execute("return [document.documentElement.scrollWidth, window.innerWidth]", vec![]).await.ok()?;
            let (scroll, inner) = (v[0].as_u64()?, v[1].as_u64()?);
            // the window took the size (within its frame) and the view is drawn
            (inner <= u64::from(w) && inner + 40 >= u64::from(w) && present(c, ready).await).then_some((scroll, inner))
        };
        let (scroll, inner) = eventually(PATIENCE, &format!("{name} at {w} px"), size).await;
        assert!(scroll <= inner, "{name} at {w} px: the page is {scroll} px wide in a {inner} px window");
        let show = "document.querySelector(arguments[0]).scrollIntoView({block: 'center'})";
        c.execute(show, vec![json!(ready)]).await.unwrap();
        std::fs::write(dir.join(format!("{name}-{w}.png")), c.screenshot().await.unwrap()).unwrap();
    }
}

/// A command as long as real ones get: the job page wraps it inside its own box.
const LONG_CALL: &str = "weka fs quota set /home/bob --hard 100GB --soft 90GB --grace 7d --owner-uid 100042 \
    --path /tenants/tenant-a/home/bob/with/a/rather/deep/directory/structure/that/goes/on/and/on --inodes-hard 1000000";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_watches_a_job_live_and_retries_a_failed_one() {
    let db = TestDb::new().await;
    let gate = Arc::new(Notify::new());
    let broken = Arc::new(AtomicBool::new(true));
    let (g, b) = (gate.clone(), broken.clone());
    let (flow, _) = Scripted::new("demo.onboard", &["preflight", "quota", "notify"], move |i, ctx| {
        let (g, b) = (g.clone(), b.clone());
        async move {
            match (i, ctx.input["mode"].as_str()) {
                (1, Some("gated")) => {
                    g.notified().await;
                    Transition::Done(json!({"quota": "100GB"}))
                }
                (1, Some("broken")) if b.load(SeqCst) => {
                    // what a backend's recorder reports: shown with the attempt
                    onramp::effects::record(json!({"system": "storage", "call": LONG_CALL, "write": true}));
                    Transition::Fail("weka: quota service unreachable".into())
                }
                _ => Transition::Done(json!({"ok": true})),
            }
        }
    });
    let engine = engine(&db, Registry::new().with(flow));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let (e, s) = (engine.clone(), stop.clone());
    let worker = worker_config("dash", Duration::from_secs(10));
    tokio::spawn(async move { onramp::app::world::World::bare(e).run(Some(listener), Some(worker), s).await.unwrap() });
    let tok = token(&engine, "ops", Role::Operator, None).await;
    let job =
        |subject: &str, mode: &str| NewJob::new("demo.onboard", subject, json!({"mode": mode}), Actor::cli("test"));
    let ids: Vec<i64> = engine
        .enqueue(&[job("tenant-a/alice", "gated"), job("tenant-a/bob", "broken")])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let (live, failed) = (ids[0], ids[1]);
    wait_state(&engine, live, "running", PATIENCE).await;
    wait_state(&engine, failed, "failed", PATIENCE).await;

    let (_driver, webdriver) = chromedriver().await;
    let c = browser(&webdriver).await;
    c.goto(&format!("{base}/dashboard")).await.unwrap();
    c.wait().for_element(Locator::Css("#token")).await.unwrap().send_keys(&tok).await.unwrap();
    click(&c, "#login button").await;
    let row = |id: i64, css: &str| format!("tr[data-job=\"{id}\"] {css}");
    reads(&c, &row(live, "[data-testid=state]"), "running").await;
    reads(&c, &row(live, "[data-testid=step]"), "quota").await;
    // the list says why: the failed job's error in its reason column; a running one has none
    reads(&c, &row(failed, "[data-testid=reason]"), "failed at quota: weka: quota service unreachable").await;
    assert!(!present(&c, &row(live, "[data-testid=reason]")).await);
    // rows are links (open in a new tab works)
    let href = c.find(Locator::Css(&row(failed, "a.row-link"))).await.unwrap().attr("href").await.unwrap();
    assert_eq!(href.as_deref(), Some(format!("#/jobs/{failed}").as_str()));
    // ages tick without a reload or an event
    let age = row(failed, "time.ago");
    let first = text_when(&c, &age, "an age", |t| t.ends_with(" ago")).await;
    text_when(&c, &age, "a newer age", |t| t != first).await;
    fits(&c, "jobs", &row(failed, "[data-testid=reason]")).await;

    // the job finishes while the page is open: the row changes without a reload
    gate.notify_one();
    reads(&c, &row(live, "[data-testid=state]"), "succeeded").await;

    // open the failed job by its row, see why, press retry
    click(&c, &format!("tr[data-job=\"{failed}\"]")).await;
    reads(&c, "[data-testid=last-error]", "weka: quota service unreachable").await;
    text_when(&c, "[data-testid=effects]", "the quota call", |t| {
        t.contains("storage") && t.contains("weka fs quota set /home/bob --hard 100GB")
    })
    .await;
    fits(&c, "job-failed", "[data-testid=effects]").await;
    broken.store(false, SeqCst);
    click(&c, "[data-testid=retry]").await;
    reads(&c, "h1 [data-testid=state]", "succeeded").await;
    // after success no error is shown as the job's, only in the attempt that had it
    assert!(!present(&c, "[data-testid=last-error]").await && !present(&c, "[data-testid=waiting]").await);
    // (the page re-renders on live updates: read each part once it shows what it should)
    text_when(&c, "[data-testid=steps]", "the failed attempt and the last step", |t| {
        t.contains("weka: quota service unreachable") && t.contains("notify")
    })
    .await;
    text_when(&c, "[data-testid=events]", "the retry recorded with the token's name", |t| t.contains("api:ops")).await;
    fits(&c, "job", "[data-testid=effects]").await;
    c.close().await.unwrap();
    stop.cancel();
}

/// `user.offboard` in name (the dashboard knows what approving it does), scripted: its drain asks
/// for a hard cutoff until someone approves; approvals need four eyes.
fn hard_cutoff_flow() -> FourEyes<Scripted> {
    let (flow, _) = Scripted::new("user.offboard", &["block", "drain", "disable_login"], |i, ctx| async move {
        match (i, &ctx.approved_by) {
            (1, None) => Transition::NeedsApproval(
                "foo/alice still has 1 running job(s) (4242) after the drain deadline: approve to cancel them \
                 (hard cutoff)"
                    .into(),
            ),
            _ => Transition::Done(json!({"ok": true})),
        }
    });
    FourEyes(flow)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approvals_wait_visibly_ask_for_confirmation_and_follow_the_role() {
    let db = TestDb::new().await;
    let (broken, _) =
        Scripted::new("demo.onboard", &["quota"], |_, _| async { Transition::Fail("weka: no quota service".into()) });
    let engine = engine(&db, Registry::new().with(hard_cutoff_flow()).with(broken));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let stop = CancellationToken::new();
    let (e, s) = (engine.clone(), stop.clone());
    let worker = worker_config("dash", Duration::from_secs(10));
    tokio::spawn(async move { onramp::app::world::World::bare(e).run(Some(listener), Some(worker), s).await.unwrap() });
    let viewer = token(&engine, "watcher", Role::Viewer, None).await;
    let operator = token(&engine, "ops", Role::Operator, None).await;
    let starter = token(&engine, "boss", Role::Admin, None).await;
    let second = token(&engine, "chief", Role::Admin, None).await;
    let ids: Vec<i64> = engine
        .enqueue(&[
            NewJob::new("user.offboard", "foo/alice", json!({}), Actor::api("boss")),
            NewJob::new("demo.onboard", "foo/bob", json!({}), Actor::cli("test")),
        ])
        .await
        .unwrap()
        .iter()
        .map(|e| e.id)
        .collect();
    let (cutoff, failed) = (ids[0], ids[1]);
    wait_state(&engine, cutoff, "needs_approval", PATIENCE).await;
    wait_state(&engine, failed, "failed", PATIENCE).await;
    let asked = "waiting for approval: foo/alice still has 1 running job(s) (4242) after the drain deadline: \
                 approve to cancel them (hard cutoff)";

    let (_driver, webdriver) = chromedriver().await;
    let c = browser(&webdriver).await;
    // a viewer: Needs attention says why each job is there; no buttons anywhere
    open_as(&c, &base, &viewer, "#/attention").await;
    reads(&c, &format!("tr[data-job=\"{cutoff}\"] [data-testid=reason]"), asked).await;
    reads(&c, &format!("tr[data-job=\"{failed}\"] [data-testid=reason]"), "failed at quota: weka: no quota service")
        .await;
    fits(&c, "attention", &format!("tr[data-job=\"{cutoff}\"]")).await;
    c.goto(&format!("{base}/dashboard#/jobs/{failed}")).await.unwrap();
    reads(&c, "[data-testid=last-error]", "weka: no quota service").await;
    assert!(!present(&c, "[data-testid=retry]").await && !present(&c, "[data-testid=cancel]").await);
    text_when(&c, "[data-testid=actions-note]", "the viewer note", |t| t.contains("need an operator token")).await;
    c.goto(&format!("{base}/dashboard#/jobs/{cutoff}")).await.unwrap();
    // waiting, not failed: no "last error"
    reads(&c, "[data-testid=waiting]", asked).await;
    assert!(!present(&c, "[data-testid=last-error]").await && !present(&c, "[data-testid=approve]").await);

    // an operator may cancel it, but approving a hard cutoff is for admins
    open_as(&c, &base, &operator, &format!("#/jobs/{cutoff}")).await;
    c.wait().for_element(Locator::Css("[data-testid=cancel]")).await.unwrap();
    assert!(!present(&c, "[data-testid=approve]").await);
    text_when(&c, "[data-testid=actions-note]", "the admin note", |t| t.contains("needs an admin token")).await;

    // the admin who started it: the confirmation names the effect; going back changes nothing
    open_as(&c, &base, &starter, &format!("#/jobs/{cutoff}")).await;
    click(&c, "[data-testid=approve]").await;
    let effect = text_when(&c, "[data-testid=confirm]", "the effect", |t| !t.is_empty()).await;
    assert!(
        effect.contains("Approve the hard cutoff of alice in foo: cancels all of alice's running Slurm jobs now")
            && effect.contains("deletes alice's Slurm association"),
        "{effect}"
    );
    fits(&c, "approve-dialog", "[data-testid=confirm]").await;
    click(&c, "[data-testid=confirm-no]").await;
    eventually(PATIENCE, "the dialog to close", || async {
        (!present(&c, "[data-testid=confirm]").await).then_some(())
    })
    .await;
    assert_eq!(engine.job(cutoff).await.unwrap().state.as_str(), "needs_approval");
    // confirmed: the server refuses (four eyes), and the refusal stays on the page
    click(&c, "[data-testid=approve]").await;
    click(&c, "[data-testid=confirm-yes]").await;
    let refused = text_when(&c, "[data-testid=action-result]", "the refusal", |t| !t.is_empty()).await;
    assert!(refused.starts_with("approve refused: 403") && refused.contains("boss"), "{refused}");
    reads(&c, "[data-testid=waiting]", asked).await; // the page was drawn again, the refusal kept
    reads(&c, "[data-testid=action-result]", refused.as_str()).await;
    assert_eq!(engine.job(cutoff).await.unwrap().state.as_str(), "needs_approval");

    // a second admin approves: the job goes on, and no longer shows the approval it waited for
    open_as(&c, &base, &second, &format!("#/jobs/{cutoff}")).await;
    click(&c, "[data-testid=approve]").await;
    click(&c, "[data-testid=confirm-yes]").await;
    reads(&c, "h1 [data-testid=state]", "succeeded").await;
    // the approval is in the audit trail
    text_when(&c, "[data-testid=events]", "the approval", |t| t.contains("api:chief") && t.contains("four eyes")).await;
    assert!(!present(&c, "[data-testid=waiting]").await && !present(&c, "[data-testid=last-error]").await);
    c.goto(&format!("{base}/dashboard#/jobs")).await.unwrap();
    c.wait().for_element(Locator::Css(&format!("tr[data-job=\"{cutoff}\"]"))).await.unwrap();
    assert!(!present(&c, &format!("tr[data-job=\"{cutoff}\"] [data-testid=reason]")).await);
    c.close().await.unwrap();
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tenants_overview_shows_limits_members_jobs_in_flight_and_drift() {
    use crate::intake_support::{AppOptions, FakeUser, app};
    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    a.add_user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    a.add_user(FakeUser::new(2, "bob", &["tenant-foo-users", "tenant-foo-ml"]));
    a.add_user(FakeUser::new(3, "dave", &["tenant-foo-users"]));
    a.cluster.set(&[("tenant-foo", "alice"), ("tenant-foo", "carol")]);
    let w = TestWorker::start(&a.engine, worker_config("dash", Duration::from_secs(10)));
    let full = a.engine.enqueue(&[onramp::flows::reconcile::full_job(Actor::cli("test"), "test")]).await.unwrap()[0].id;
    wait_state(&a.engine, full, "succeeded", PATIENCE).await;
    let tok = token(&a.engine, "ops", Role::Viewer, None).await;

    let (_driver, webdriver) = chromedriver().await;
    let c = browser(&webdriver).await;
    c.goto(&format!("{}/dashboard#/tenants", a.base)).await.unwrap();
    c.wait().for_element(Locator::Css("#token")).await.unwrap().send_keys(&tok).await.unwrap();
    click(&c, "#login button").await;
    let foo = |testid: &str| format!("[data-tenant=foo] [data-testid={testid}]");
    // three members, two associations (alice, carol): bob and dave to onboard, carol to offboard
    reads(&c, &foo("members"), "3").await;
    reads(&c, &foo("associations"), "2 Slurm associations").await;
    reads(&c, &foo("drift"), "2 to onboard · 1 to offboard").await;
    reads(&c, &foo("limits"), "Fairshare 300 · GrpTRES gres/gpu=16 · GrpJobs 50").await;
    // the counts say how old they are
    for age in ["members-as-of", "drift-as-of"] {
        text_when(&c, &foo(age), "as of … ago", |t| t.starts_with("as of ") && t.contains(" ago")).await;
    }
    // the onboardings and the offboarding it started wait (stand-ins): in flight, live
    reads(&c, &foo("in-flight"), "3").await;
    reads(&c, &foo("teams"), "ml-team-foo (tenant-foo-ml)").await;
    // the names onramp uses in Kubernetes: the runbook's
    reads(&c, &foo("k8s-namespace"), "namespace tenant-foo").await;
    reads(&c, &foo("k8s-secret"), "secret tenant-foo-authorized-keys").await;
    reads(&c, &foo("k8s-cluster"), "slurmcluster cluster-tenant-foo").await;
    reads(&c, &foo("k8s-nodes"), "nodes reserved.tenant=tenant-foo").await;
    reads(&c, "[data-tenant=bar] [data-testid=members]", "0").await;
    fits(&c, "tenants", &foo("members")).await;

    // each tenant links to its users; the view shows them, or says clearly why it cannot
    click(&c, &foo("users-link")).await;
    eventually(PATIENCE, "the users view or its error", || async {
        let ok = present(&c, "[data-testid=users] tr[data-user]").await;
        let err = text_of(&c, "[data-testid=users-error]").await;
        (ok || err.is_some_and(|e| e.starts_with("Could not load the users of foo: "))).then_some(())
    })
    .await;
    fits(&c, "users-or-error", "[data-testid=users], [data-testid=users-error]").await;
    c.close().await.unwrap();
    w.shutdown().await;
}

/// Each tenant's users with their state (GET /v1/tenants/{t}/users), at both sizes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_users_view() {
    use crate::intake_support::{AppOptions, FakeUser, app};
    let db = TestDb::new().await;
    let a = app(&db, AppOptions::default()).await;
    a.add_user(FakeUser::new(1, "alice", &["tenant-foo-users"]));
    a.add_user(FakeUser::new(2, "bob", &["tenant-foo-users", "tenant-foo-ml"]));
    a.cluster.set(&[("tenant-foo", "alice")]);
    let w = TestWorker::start(&a.engine, worker_config("dash", Duration::from_secs(10)));
    let full = a.engine.enqueue(&[onramp::flows::reconcile::full_job(Actor::cli("test"), "test")]).await.unwrap()[0].id;
    wait_state(&a.engine, full, "succeeded", PATIENCE).await;
    // bob's onboarding (a stand-in that asks for approval)
    let filter = JobFilter { subject: Some("foo/bob".into()), limit: 10, ..Default::default() };
    let bobs = eventually(PATIENCE, "bob's onboarding", || async {
        let jobs = a.engine.list(&filter).await.unwrap();
        jobs.into_iter().find(|j| j.state.as_str() == "needs_approval")
    })
    .await;
    let tok = token(&a.engine, "ops", Role::Viewer, None).await;

    let (_driver, webdriver) = chromedriver().await;
    let c = browser(&webdriver).await;
    open_as(&c, &a.base, &tok, "#/tenants/foo/users").await;
    let user = |name: &str, css: &str| format!("[data-testid=users] tr[data-user={name}] {css}");
    reads(&c, &user("bob", "[data-testid=user-state]"), "waiting for approval").await;
    text_when(&c, &user("bob", "[data-testid=user-reason]"), "why bob waits", |t| t.contains("test stand-in")).await;
    assert!(present(&c, &user("alice", "[data-testid=user-state]")).await);
    text_when(&c, "[data-testid=users-as-of]", "the reconcile's age", |t| t.contains("as of ") && t.contains(" ago"))
        .await;
    fits(&c, "users", &user("bob", "[data-testid=user-state]")).await;
    // bob's page: his state and his jobs, linked
    click(&c, &user("bob", "a.row-link")).await;
    c.wait().for_element(Locator::Css(&format!("tr[data-job=\"{}\"]", bobs.id))).await.unwrap();
    reads(&c, "[data-user=bob] [data-testid=user-state]", "waiting for approval").await;
    fits(&c, "user", &format!("tr[data-job=\"{}\"]", bobs.id)).await;
    c.close().await.unwrap();
    w.shutdown().await;
}

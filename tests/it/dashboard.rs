//! The dashboard in a real headless Chromium (Debian's chromium + chromium-driver): sign in, see
//! a job change state live, open a failed job, press retry, see it succeed; the tenants overview
//! after a reconcile. Saves screenshots to target/artifacts/dashboard*.png.

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use onramp::engine::{Actor, NewJob, Registry, Transition};
use onramp::http::access::Role;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::process::Command;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::common::*;
use crate::engine_flows::Scripted;
use crate::http_api::token;

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
    eventually(Duration::from_secs(20), "chromedriver to answer", || async {
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
                    let call = "weka fs quota set /home/bob --hard 100GB --soft 90GB";
                    onramp::effects::record(json!({"system": "storage", "call": call, "write": true}));
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
    wait_state(&engine, live, "running", Duration::from_secs(10)).await;
    wait_state(&engine, failed, "failed", Duration::from_secs(10)).await;

    let (_driver, webdriver) = chromedriver().await;
    let c = browser(&webdriver).await;
    c.goto(&format!("{base}/dashboard")).await.unwrap();
    c.wait().for_element(Locator::Css("#token")).await.unwrap().send_keys(&tok).await.unwrap();
    c.find(Locator::Css("#login button")).await.unwrap().click().await.unwrap();
    let row = format!("tr[data-job=\"{live}\"] [data-testid=state]");
    let seen = |css: String, want: &'static str| {
        let c = c.clone();
        async move {
            eventually(Duration::from_secs(20), &format!("{css} to read {want}"), || {
                let (c, css) = (c.clone(), css.clone());
                async move { (text_of(&c, &css).await.as_deref() == Some(want)).then_some(()) }
            })
            .await
        }
    };
    seen(row.clone(), "running").await;
    assert_eq!(text_of(&c, &format!("tr[data-job=\"{live}\"] [data-testid=step]")).await.as_deref(), Some("quota"));
    // the job finishes while the page is open: the row changes without a reload
    gate.notify_one();
    seen(row, "succeeded").await;

    // open the failed job, see why, press retry
    c.find(Locator::Css(&format!("tr[data-job=\"{failed}\"]"))).await.unwrap().click().await.unwrap();
    seen("[data-testid=last-error]".into(), "weka: quota service unreachable").await;
    broken.store(false, SeqCst);
    c.find(Locator::Css("[data-testid=retry]")).await.unwrap().click().await.unwrap();
    seen("h1 [data-testid=state]".into(), "succeeded").await;
    let steps = text_of(&c, "[data-testid=steps]").await.unwrap();
    assert!(steps.contains("weka: quota service unreachable") && steps.contains("notify"), "{steps}");
    let calls = text_of(&c, "[data-testid=effects]").await.unwrap_or_default();
    assert!(calls.contains("storage") && calls.contains("weka fs quota set /home/bob --hard 100GB"), "{calls}");
    let audit = text_of(&c, "[data-testid=events]").await.unwrap();
    assert!(audit.contains("api:ops"), "the retry is recorded with the token's name: {audit}");

    let png = c.screenshot().await.unwrap();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dashboard.png"), png).unwrap();
    // a phone-sized window still shows the list
    c.set_window_size(390, 844).await.unwrap();
    c.goto(&format!("{base}/dashboard#/jobs")).await.unwrap();
    c.wait().for_element(Locator::Css(&format!("tr[data-job=\"{failed}\"]"))).await.unwrap();
    std::fs::write(dir.join("dashboard-phone.png"), c.screenshot().await.unwrap()).unwrap();
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
    wait_state(&a.engine, full, "succeeded", Duration::from_secs(20)).await;
    let tok = token(&a.engine, "ops", Role::Viewer, None).await;

    let (_driver, webdriver) = chromedriver().await;
    let c = browser(&webdriver).await;
    c.goto(&format!("{}/dashboard#/tenants", a.base)).await.unwrap();
    c.wait().for_element(Locator::Css("#token")).await.unwrap().send_keys(&tok).await.unwrap();
    c.find(Locator::Css("#login button")).await.unwrap().click().await.unwrap();
    let foo = |testid: &str| format!("[data-tenant=foo] [data-testid={testid}]");
    let reads = |css: String, want: &'static str| {
        let c = c.clone();
        async move {
            eventually(Duration::from_secs(20), &format!("{css} to read {want}"), || {
                let (c, css) = (c.clone(), css.clone());
                async move { (text_of(&c, &css).await.as_deref() == Some(want)).then_some(()) }
            })
            .await
        }
    };
    // three members, two associations (alice, carol): bob and dave to onboard, carol to offboard
    reads(foo("members"), "3").await;
    reads(foo("associations"), "2 Slurm associations").await;
    reads(foo("drift"), "2 to onboard · 1 to offboard").await;
    reads(foo("limits"), "Fairshare 300 · GrpTRES gres/gpu=16 · GrpJobs 50").await;
    // the onboardings and the offboarding it started wait (stand-ins): in flight, live
    reads(foo("in-flight"), "3").await;
    assert_eq!(text_of(&c, &foo("teams")).await.as_deref(), Some("ml-team-foo (tenant-foo-ml)"));
    // the names onramp uses in Kubernetes: the runbook's
    assert_eq!(text_of(&c, &foo("k8s-namespace")).await.as_deref(), Some("namespace tenant-foo"));
    assert_eq!(text_of(&c, &foo("k8s-secret")).await.as_deref(), Some("secret tenant-foo-authorized-keys"));
    assert_eq!(text_of(&c, &foo("k8s-cluster")).await.as_deref(), Some("slurmcluster cluster-tenant-foo"));
    assert_eq!(text_of(&c, &foo("k8s-nodes")).await.as_deref(), Some("nodes reserved.tenant=tenant-foo"));
    reads("[data-tenant=bar] [data-testid=members]".into(), "0").await;

    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("dashboard-tenants.png"), c.screenshot().await.unwrap()).unwrap();
    c.set_window_size(390, 844).await.unwrap();
    c.refresh().await.unwrap();
    reads(foo("members"), "3").await;
    std::fs::write(dir.join("dashboard-tenants-phone.png"), c.screenshot().await.unwrap()).unwrap();
    c.close().await.unwrap();
    w.shutdown().await;
}

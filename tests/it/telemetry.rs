//! Traces as a collector receives them (an in-process OTLP receiver): one webhook is one trace
//! from the request to every step attempt of the jobs it caused; a worker process exports its
//! step spans into the trace stored on the job and serves health and metrics on its own listener.

use std::process::Stdio;
use std::time::Duration;

use onramp::app::telemetry::{OtelSettings, otel_layer};
use onramp::engine::{Actor, JobState, NewJob};
use onramp::flows::reconcile::RECONCILE_USER;
use onramp::flows::user_onboard::USER_ONBOARD;
use opentelemetry_otlp::Protocol;
use serde_json::json;
use tracing_subscriber::layer::SubscriberExt;

use crate::common::{TestDb, eventually, run_in_own_process, signal, wait_state};
use crate::flows_support::{CAROL, Harness, short};
use crate::otlp::{Receiver, Span};

const T: Duration = Duration::from_secs(90);

fn step_spans(spans: &[Span], job: i64) -> Vec<&Span> {
    let id = job.to_string();
    spans.iter().filter(|s| s.attr("job") == Some(id.as_str()) && s.attr("step").is_some()).collect()
}

/// Runs [`one_webhook_trace`] in a process of its own (this test binary again, that test only):
/// tracing caches per call site whether anyone listens, process-wide, and a call site first hit
/// by another test's thread while this test's subscriber was being set could stay unheard. The
/// harness's user (carol) stays locked for this process meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_webhook_is_one_trace_from_the_request_to_each_step_attempt() {
    let _one = CAROL.lock().await;
    run_in_own_process("telemetry::one_webhook_trace", &["--ignored"], &[]).await;
}

/// The current-thread runtime runs every task of the harness (HTTP server, intake writer, worker)
/// on this thread, so a subscriber set for the thread sees them all.
#[tokio::test]
#[ignore = "run in its own process by one_webhook_is_one_trace_from_the_request_to_each_step_attempt"]
async fn one_webhook_trace() {
    let receiver = Receiver::start();
    let otel = OtelSettings {
        endpoint: format!("{}/v1/traces", receiver.base),
        protocol: Protocol::HttpBinary,
        service_name: "onramp".into(),
        role: "both".into(),
    };
    let provider = otel.provider().unwrap();
    let _traced = tracing::subscriber::set_default(tracing_subscriber::registry().with(otel_layer(&provider)));

    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();
    let answer = h.post_user_event().await;
    assert_eq!(answer.status().as_u16(), 202);
    let request_id = answer.headers()["x-request-id"].to_str().unwrap().to_string();
    let onboard =
        eventually(T, "the onboarding job", || async { h.jobs(USER_ONBOARD).await.first().map(|j| j.0) }).await;
    wait_state(&h.engine, onboard, "succeeded", T).await;
    let reconcile = h.jobs(RECONCILE_USER).await[0].0;
    let attempts = h.engine.step_runs(onboard).await.unwrap().len();
    assert!(attempts >= h.engine.registry().steps(USER_ONBOARD).unwrap().len());

    // every attempt's span has ended and gone out (flushing blocks this thread, not the receiver)
    let spans = eventually(Duration::from_secs(20), "every step attempt's span", || {
        provider.force_flush().unwrap();
        let spans = receiver.spans();
        async move { (step_spans(&spans, onboard).len() == attempts).then_some(spans) }
    })
    .await;

    let request = spans.iter().find(|s| s.name == "POST /webhooks/authentik").expect("the request's span");
    assert_eq!(
        (request.attr("http.route"), request.attr("http.response.status_code"), request.attr("request_id")),
        (Some("/webhooks/authentik"), Some("202"), Some(request_id.as_str()))
    );
    assert_eq!((request.parent_id.as_str(), request.resource["service.name"].as_str()), ("", "onramp"));
    let trace = request.trace_id.clone();
    let delivery = spans.iter().find(|s| s.name == "delivery").expect("the delivery's span");
    assert_eq!((&delivery.trace_id, &delivery.parent_id), (&trace, &request.span_id));

    let reconciles = step_spans(&spans, reconcile);
    assert!(!reconciles.is_empty());
    for s in &reconciles {
        assert_eq!((&s.trace_id, &s.parent_id), (&trace, &delivery.span_id), "{s:?}");
        assert_eq!(s.attr("kind"), Some(RECONCILE_USER));
    }
    let mut seen = vec![];
    for s in step_spans(&spans, onboard) {
        assert_eq!(s.trace_id, trace, "{s:?}");
        assert!(reconciles.iter().any(|r| r.span_id == s.parent_id), "a child of the reconcile step: {s:?}");
        assert_eq!((s.attr("kind"), s.attr("tenant")), (Some(USER_ONBOARD), Some(h.tenant.as_str())), "{s:?}");
        assert!(s.attr("attempt").is_some_and(|a| a.parse::<u32>().unwrap() >= 1), "{s:?}");
        assert_eq!(s.name, format!("{USER_ONBOARD} {}", s.attr("step").unwrap()));
        seen.push(s.attr("step").unwrap().to_string());
    }
    for step in h.engine.registry().steps(USER_ONBOARD).unwrap() {
        assert!(seen.iter().any(|s| s == step), "no span of step {step}: {seen:?}");
    }
    // nothing that was not asked for: one trace for the one webhook
    assert!(spans.iter().all(|s| s.trace_id == trace), "{spans:#?}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_process_answers_health_and_metrics_and_exports_its_steps_into_the_jobs_trace() {
    let db = TestDb::new().await;
    let receiver = Receiver::start();
    let port = free_port();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_onramp"))
        .args(["serve", "--role", "worker", "--worker-id", "traced", "--poll-interval", "1s"])
        .env("DATABASE_URL", &db.url)
        .env("ONRAMP_LOG", "warn")
        .env("ONRAMP_WORKER_LISTEN", format!("127.0.0.1:{port}"))
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.base)
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json")
        .env_remove("ONRAMP_CONFIG")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // its own small listener: health, readiness and metrics, and nothing of the API
    let http = reqwest::Client::new();
    let base = format!("http://127.0.0.1:{port}");
    let get = |path: &str| http.get(format!("{base}{path}")).send();
    eventually(Duration::from_secs(20), "the worker's listener", || async { get("/healthz").await.ok() }).await;
    assert_eq!(get("/readyz").await.unwrap().status().as_u16(), 200);
    let metrics = get("/metrics").await.unwrap();
    assert_eq!(metrics.status().as_u16(), 200);
    assert!(metrics.text().await.unwrap().contains("onramp_steps_claimed_total"));
    assert_eq!(get("/v1/jobs").await.unwrap().status().as_u16(), 404);

    // a job enqueued inside a trace: its steps, run by the worker process, join that trace
    let (trace, parent) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let mut job = NewJob::new("selftest", "tenant-t/alice", json!({}), Actor::cli("test"));
    job.traceparent = Some(format!("00-{trace}-{parent}-01"));
    let engine = crate::common::engine(&db, onramp::flows::registry());
    let id = engine.enqueue(&[job]).await.unwrap()[0].id;
    wait_state(&engine, id, JobState::Succeeded.as_str(), Duration::from_secs(30)).await;
    let steps = engine.step_runs(id).await.unwrap().len();
    // SIGTERM: the process sends what it still holds before it exits
    signal(&child, "-TERM");
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "{status}");

    let spans = receiver.spans();
    let ours = step_spans(&spans, id);
    assert_eq!(ours.len(), steps, "{spans:#?}");
    for s in ours {
        assert_eq!((s.trace_id.as_str(), s.parent_id.as_str(), s.via), (trace, parent, "json"), "{s:?}");
        assert_eq!(
            (s.attr("kind"), s.attr("tenant"), s.attr("attempt")),
            (Some("selftest"), Some("tenant-t"), Some("1"))
        );
        let r = &s.resource;
        assert_eq!((r["service.name"].as_str(), r["onramp.role"].as_str()), ("onramp", "worker"), "{r:?}");
    }
}

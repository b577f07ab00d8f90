//! A webhook sender as Authentik's is: each delivery is resent (same id, body and signature)
//! until it is acknowledged with a 2xx, across refused connections, resets and 5xx answers,
//! round-robin over the api replicas. It keeps what happened to every delivery.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

use super::webhook::Delivery;

/// What happened to one delivery.
#[derive(Clone, Debug, Default)]
pub struct Outcome {
    /// Attempts until the acknowledgement (1: at once).
    pub attempts: u32,
    /// Answers that were not a 2xx, and attempts without an answer.
    pub refused: u32,
    /// The acknowledgement said the delivery was already stored (`"duplicate": true`).
    pub duplicate: bool,
}

/// The sender's counts while it runs.
#[derive(Default)]
pub struct Progress {
    /// Deliveries acknowledged so far.
    pub acknowledged: AtomicUsize,
    /// Attempts that got no 2xx.
    pub refused: AtomicUsize,
}

/// Sends every delivery (at most `parallel` at once, the n-th not before n × `pace`) until each
/// is acknowledged; panics if one is not within `deadline`. Each delivery's id with its outcome,
/// in the order given.
pub async fn deliver_all(
    http: reqwest::Client,
    urls: Vec<String>,
    deliveries: Vec<Delivery>,
    parallel: usize,
    pace: Duration,
    deadline: Duration,
    progress: Arc<Progress>,
) -> Vec<(String, Outcome)> {
    let gate = Arc::new(Semaphore::new(parallel));
    let outcomes = Arc::new(Mutex::new(BTreeMap::new()));
    let mut sent = tokio::task::JoinSet::new();
    let start = tokio::time::Instant::now();
    for (n, d) in deliveries.into_iter().enumerate() {
        let (http, gate, progress, outcomes) = (http.clone(), gate.clone(), progress.clone(), outcomes.clone());
        let urls = urls.clone();
        sent.spawn(async move {
            tokio::time::sleep_until(start + pace * n as u32).await;
            let _permit = gate.acquire_owned().await.unwrap();
            let end = tokio::time::Instant::now() + deadline;
            let mut o = Outcome::default();
            loop {
                o.attempts += 1;
                let url = format!("{}/webhooks/authentik", urls[(n + o.attempts as usize) % urls.len()]);
                let answer = d.try_send(&http, &url).await;
                match answer {
                    Ok((s, body)) if s.is_success() => {
                        o.duplicate = body["duplicate"] == true;
                        break;
                    }
                    Ok((s, _)) if s.is_client_error() && s != reqwest::StatusCode::TOO_MANY_REQUESTS => {
                        panic!("delivery {} was refused for good: {s}", d.id)
                    }
                    _ => {
                        o.refused += 1;
                        progress.refused.fetch_add(1, Ordering::Relaxed);
                        assert!(tokio::time::Instant::now() < end, "delivery {} not acknowledged: {answer:?}", d.id);
                        // a sender's back-off between attempts
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
            }
            progress.acknowledged.fetch_add(1, Ordering::Relaxed);
            outcomes.lock().unwrap().insert(n, (d.id.clone(), o));
        });
    }
    while let Some(r) = sent.join_next().await {
        r.unwrap();
    }
    Arc::try_unwrap(outcomes).unwrap().into_inner().unwrap().into_values().collect()
}

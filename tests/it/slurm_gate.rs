//! The Slurm write gate in PostgreSQL: the replicas' writes one at a time, quietly.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use onramp::backends::slurm::{PgWriteGate, WriteGate};
use tracing_subscriber::layer::SubscriberExt;

use crate::common::*;

const SECS10: Duration = Duration::from_secs(10);

async fn locks(db: &TestDb, granted: bool) -> i64 {
    sqlx::query_scalar(
        "select count(*) from pg_locks where locktype = 'advisory' and granted = $1 \
         and database = (select oid from pg_database where datname = current_database())",
    )
    .bind(granted)
    .fetch_one(&db.pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_slurm_write_gate_admits_one_process_at_a_time_and_opens_when_dropped() {
    let db = TestDb::new().await;
    // two gates stand for two replicas: each enter opens a session of its own
    let (a, b) = (PgWriteGate::new(&db.pool), PgWriteGate::new(&db.pool));
    let held = a.enter().await.unwrap();
    let waiting = tokio::spawn(async move { b.enter().await.map(|_| ()) });
    assert_eq!(locks(&db, true).await, 1);
    eventually(SECS10, "the second writer to queue", || async { (locks(&db, false).await == 1).then_some(()) }).await;
    assert!(!waiting.is_finished());
    drop(held); // e.g. the step was stopped mid-write: the session ends, the lock goes with it
    tokio::time::timeout(SECS10, waiting).await.expect("the second writer got in").unwrap().unwrap();
}

/// What a log subscriber wrote.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Set in the process [`waiting_for_the_slurm_write_gate_is_not_logged_as_a_slow_statement`]
/// starts for itself.
const ALONE: &str = "ONRAMP_TEST_GATE_LOG_ALONE";

/// A replica waiting for another's write is the gate at work, not a slow statement: sqlx warns of
/// every statement over a second, and each wait for the gate longer than that was a WARN line.
/// The test runs again in a process of its own (this binary, this test only), where its
/// subscriber is the only one: tracing caches per call site whether anyone listens, process-wide,
/// and other tests' threads would race it (as in `telemetry.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_for_the_slurm_write_gate_is_not_logged_as_a_slow_statement() {
    if std::env::var_os(ALONE).is_none() {
        let test = "slurm_gate::waiting_for_the_slurm_write_gate_is_not_logged_as_a_slow_statement";
        run_in_own_process(test, &[], &[(ALONE, "1")]).await;
        return;
    }
    let seen = Captured::default();
    let writer = seen.clone();
    let layer = tracing_subscriber::fmt::layer().with_ansi(false).with_writer(move || writer.clone());
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer)).unwrap();
    let db = TestDb::new().await;
    let from = seen.0.lock().unwrap().len(); // the migrations' own advisory lock comes before
    let (a, b) = (PgWriteGate::new(&db.pool), PgWriteGate::new(&db.pool));
    let held = a.enter().await.unwrap();
    let waiting = tokio::spawn(async move { b.enter().await.map(|_| ()) });
    eventually(SECS10, "the second writer to wait longer than sqlx's slow-statement threshold", || async {
        let n: i64 = sqlx::query_scalar(
            "select count(*) from pg_stat_activity where datname = current_database() \
             and wait_event_type = 'Lock' and now() - query_start > interval '1.5 seconds'",
        )
        .fetch_one(&db.pool)
        .await
        .unwrap();
        (n == 1).then_some(())
    })
    .await;
    drop(held);
    tokio::time::timeout(SECS10, waiting).await.expect("the second writer got in").unwrap().unwrap();
    let logged = String::from_utf8(seen.0.lock().unwrap()[from..].to_vec()).unwrap();
    assert!(logged.contains("select count(*) from pg_stat_activity"), "the capture sees sqlx's statements");
    let gate: Vec<&str> = logged.lines().filter(|l| l.contains("pg_advisory_lock")).collect();
    assert!(gate.is_empty(), "{gate:#?}");
}

//! The pool's check of a connection before handing it out (`onramp::app::db::pool_options`):
//! one idle for a while is pinged and replaced if the server closed it; one in use a moment ago
//! is handed out as it is, so a break in that moment fails one statement, not the next.

use std::time::Duration;

use onramp::app::db::pool_options_pinging_after;
use sqlx::PgPool;

use crate::common::{TestDb, eventually};

// One connection at most, so the statement after the termination meets the terminated one.

async fn backend_pid(pool: &PgPool) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("select pg_backend_pid()").fetch_one(pool).await
}

/// Terminates the backend `pid` (from another connection) and waits until it is gone. First
/// waits for `pool`'s connection to be back among its idle ones: sqlx checks a connection as it
/// comes back, and that check must not be what meets the termination.
async fn terminate(db: &TestDb, pool: &PgPool, pid: i32) {
    eventually(Duration::from_secs(10), "the connection back in the pool", || async {
        (pool.num_idle() == 1).then_some(())
    })
    .await;
    let sent: bool = sqlx::query_scalar("select pg_terminate_backend($1)").bind(pid).fetch_one(&db.pool).await.unwrap();
    assert!(sent, "backend {pid} was not there to terminate");
    eventually(Duration::from_secs(10), "the terminated backend to exit", || async {
        let alive: bool = sqlx::query_scalar("select exists (select 1 from pg_stat_activity where pid = $1)")
            .bind(pid)
            .fetch_one(&db.pool)
            .await
            .unwrap();
        (!alive).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_connection_the_server_closed_while_idle_is_replaced_before_it_is_handed_out() {
    let db = TestDb::new().await;
    // every connection counts as idle long enough: each is pinged before it is handed out
    let pool = pool_options_pinging_after(4, Duration::ZERO).max_connections(1).connect(&db.url).await.unwrap();
    let first = backend_pid(&pool).await.unwrap();
    terminate(&db, &pool, first).await;
    let second = backend_pid(&pool).await.expect("the pool replaced the closed connection");
    assert_ne!(first, second, "a new connection, not the closed one");
    pool.close().await;
}

#[tokio::test]
async fn a_connection_that_broke_right_after_use_fails_one_statement_and_is_then_replaced() {
    let db = TestDb::new().await;
    // no connection counts as idle long enough: none is pinged
    let pool =
        pool_options_pinging_after(4, Duration::from_secs(3600)).max_connections(1).connect(&db.url).await.unwrap();
    let first = backend_pid(&pool).await.unwrap();
    terminate(&db, &pool, first).await;
    assert!(backend_pid(&pool).await.is_err(), "handed out unchecked: the statement meets the closed connection");
    // sqlx checks a connection as it comes back and closes a broken one
    let second = eventually(Duration::from_secs(10), "a statement on a new connection", || async {
        backend_pid(&pool).await.ok()
    })
    .await;
    assert_ne!(first, second);
    pool.close().await;
}

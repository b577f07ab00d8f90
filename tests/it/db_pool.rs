//! The checks of a connection before a statement, against a real server that closes it:
//! - the pool's (`onramp::app::db::pool_options`): one idle for a while is pinged and replaced if
//!   the server closed it; one in use a moment ago is handed out as it is, so a break in that
//!   moment fails one statement, not the next;
//! - those of a connection a busy loop keeps (`onramp::engine::kept::Kept`), which are the same,
//!   and the connection is kept: one connection for every statement, none back in the pool.

use std::time::Duration;

use onramp::app::db::pool_options_pinging_after;
use onramp::engine::kept::Kept;
use sqlx::{PgConnection, PgPool};

use crate::common::{TestDb, eventually};

async fn backend_pid<'c>(db: impl sqlx::PgExecutor<'c>) -> Result<i32, sqlx::Error> {
    sqlx::query_scalar("select pg_backend_pid()").fetch_one(db).await
}

/// A pool of one connection, so the statement after the termination meets the terminated one.
async fn pool_of_one(db: &TestDb, ping_after: Duration) -> PgPool {
    pool_options_pinging_after(1, ping_after).max_connections(1).connect(&db.url).await.unwrap()
}

/// Waits for `pool`'s connection to be back among its idle ones: sqlx checks a connection as it
/// comes back, and that check must not be what meets a termination.
async fn back_in_pool(pool: &PgPool) {
    eventually(Duration::from_secs(10), "the connection back in the pool", || async {
        (pool.num_idle() == 1).then_some(())
    })
    .await;
}

/// Terminates the backend `pid` (from another connection) and waits until it is gone.
async fn terminate(db: &TestDb, pid: i32) {
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
    let pool = pool_of_one(&db, Duration::ZERO).await;
    let first = backend_pid(&pool).await.unwrap();
    back_in_pool(&pool).await;
    terminate(&db, first).await;
    let second = backend_pid(&pool).await.expect("the pool replaced the closed connection");
    assert_ne!(first, second, "a new connection, not the closed one");
    pool.close().await;
}

#[tokio::test]
async fn a_connection_that_broke_right_after_use_fails_one_statement_and_is_then_replaced() {
    let db = TestDb::new().await;
    // no connection counts as idle long enough: none is pinged
    let pool = pool_of_one(&db, Duration::from_secs(3600)).await;
    let first = backend_pid(&pool).await.unwrap();
    back_in_pool(&pool).await;
    terminate(&db, first).await;
    assert!(backend_pid(&pool).await.is_err(), "handed out unchecked: the statement meets the closed connection");
    // sqlx checks a connection as it comes back and closes a broken one
    let second = eventually(Duration::from_secs(10), "a statement on a new connection", || async {
        backend_pid(&pool).await.ok()
    })
    .await;
    assert_ne!(first, second);
    pool.close().await;
}

async fn kept_pid(kept: &mut Kept) -> Result<i32, sqlx::Error> {
    let conn: &mut PgConnection = kept.get().await?;
    backend_pid(conn).await
}

#[tokio::test]
async fn a_kept_connection_serves_every_statement_and_is_not_given_back() {
    let db = TestDb::new().await;
    let pool = pool_of_one(&db, Duration::ZERO).await;
    let mut kept = Kept::pinging_after(pool.clone(), Duration::from_secs(3600));
    assert_eq!((pool.size(), pool.num_idle()), (1, 1), "the pool's first connection, idle");
    let first = kept_pid(&mut kept).await.unwrap();
    for _ in 0..20 {
        assert_eq!(kept_pid(&mut kept).await.unwrap(), first);
    }
    assert_eq!((pool.size(), pool.num_idle()), (1, 0), "held by the loop, never back in the pool");
    // given back, it serves the pool again
    kept.discard();
    back_in_pool(&pool).await;
    assert_eq!(backend_pid(&pool).await.unwrap(), first);
    pool.close().await;
}

#[tokio::test]
async fn a_kept_connection_the_server_closed_while_idle_is_replaced_before_the_next_statement() {
    let db = TestDb::new().await;
    let pool = pool_of_one(&db, Duration::from_secs(3600)).await;
    // every use counts as after a long idle time: pinged before each statement
    let mut kept = Kept::pinging_after(pool.clone(), Duration::ZERO);
    let first = kept_pid(&mut kept).await.unwrap();
    terminate(&db, first).await;
    let second = kept_pid(&mut kept).await.expect("the closed connection replaced before the statement");
    assert_ne!(first, second);
    drop(kept); // closing a pool waits for every connection to come back
    pool.close().await;
}

#[tokio::test]
async fn a_kept_connection_that_broke_right_after_use_fails_one_statement_and_is_then_replaced() {
    let db = TestDb::new().await;
    let pool = pool_of_one(&db, Duration::from_secs(3600)).await;
    let mut kept = Kept::pinging_after(pool.clone(), Duration::from_secs(3600));
    let first = kept_pid(&mut kept).await.unwrap();
    terminate(&db, first).await;
    assert!(kept_pid(&mut kept).await.is_err(), "not checked: the statement meets the closed connection");
    // what the loops do after a failed statement: the pool's check as it comes back closes it,
    // and the next statement waits for the pool's one connection, a new one
    kept.discard();
    let second = kept_pid(&mut kept).await.expect("a statement on a new connection");
    assert_ne!(first, second);
    drop(kept); // closing a pool waits for every connection to come back
    pool.close().await;
}

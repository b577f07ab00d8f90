//! A connection a busy loop keeps between its statements.
//!
//! Every connection handed back to sqlx's pool is pinged before another task may take it (a
//! round trip in a spawned task, which sqlx does not let a pool turn off). A loop that runs
//! hundreds of statements a second (the claimer, the result writer, the webhook writer) keeps one
//! connection instead: no acquire, no release, no ping. Like the pool, it pings a connection that
//! sat idle for [`PING_IDLE_AFTER`] before using it, and a connection whose statement failed is
//! given back (where sqlx's check closes it if it is broken) and another one taken next time.

use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Connection, PgConnection, PgPool, Postgres};

/// A connection unused this long is pinged before its next statement (as the pool does).
pub const PING_IDLE_AFTER: Duration = Duration::from_secs(1);

pub struct Kept {
    pool: PgPool,
    conn: Option<(PoolConnection<Postgres>, Instant)>,
    ping_after: Duration,
}

impl Kept {
    /// Takes a connection from `pool` at the first `get`, not before (a writer that never writes
    /// holds none).
    pub fn new(pool: PgPool) -> Self {
        Self::pinging_after(pool, PING_IDLE_AFTER)
    }

    /// [`Kept::new`], pinging a connection unused for `idle` or more (the tests vary it).
    pub fn pinging_after(pool: PgPool, idle: Duration) -> Self {
        Self { pool, conn: None, ping_after: idle }
    }

    /// The kept connection, checked if it sat idle; a new one from the pool if there is none.
    pub async fn get(&mut self) -> Result<&mut PgConnection, sqlx::Error> {
        if let Some((conn, used)) = &mut self.conn
            && used.elapsed() >= self.ping_after
            && conn.ping().await.is_err()
        {
            self.conn = None;
        }
        if self.conn.is_none() {
            self.conn = Some((self.pool.acquire().await?, Instant::now()));
        }
        let (conn, used) = self.conn.as_mut().expect("a connection was just taken");
        *used = Instant::now();
        Ok(&mut **conn)
    }

    /// After a failed statement: the connection goes back to the pool (whose check closes it if
    /// it is broken) and the next `get` takes another.
    pub fn discard(&mut self) {
        self.conn = None;
    }
}

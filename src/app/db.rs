//! The database: connecting (errors name the server, never the password) and migrations.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgPool};

use crate::domain::secret::Secret;

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Where a URL points, for messages: `user@host:port/db`, no password.
pub fn describe(url: &Secret) -> String {
    match PgConnectOptions::from_str(url.expose()) {
        Ok(o) => format!(
            "{}@{}:{}/{}",
            o.get_username(),
            o.get_host(),
            o.get_port(),
            o.get_database().unwrap_or("(default)")
        ),
        Err(_) => "(unparsable DATABASE_URL)".into(),
    }
}

/// A pooled connection idle at least this long is pinged before it is handed out (the same for
/// the connections the engine's busy loops keep).
pub use crate::engine::kept::PING_IDLE_AFTER;

/// The fewest connections a pool may open, whatever is asked.
pub const MIN_POOL_SIZE: u32 = 4;

/// The pool's settings (the benches use them too, so they measure what runs).
///
/// sqlx pings every connection it hands out by default: a round trip before each statement,
/// about a quarter of the webhook writer's time per batch (issue 16). A connection that was in
/// use within [`PING_IDLE_AFTER`] is handed out as it is; one that breaks in that second fails its
/// statement, and sqlx's own check as it comes back closes it. One idle longer (the server may
/// have restarted, a firewall may have dropped it) is still pinged, and replaced if it fails.
pub fn pool_options(max_connections: u32) -> PgPoolOptions {
    pool_options_pinging_after(max_connections, PING_IDLE_AFTER)
}

/// [`pool_options`] with another idle time before the ping (the tests vary it).
pub fn pool_options_pinging_after(max_connections: u32, idle: Duration) -> PgPoolOptions {
    PgPoolOptions::new()
        .max_connections(max_connections.max(MIN_POOL_SIZE))
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(false)
        .before_acquire(move |conn, meta| {
            Box::pin(async move {
                if meta.idle_for >= idle {
                    conn.ping().await?;
                }
                Ok(true)
            })
        })
}

pub async fn connect(url: &Secret, max_connections: u32) -> anyhow::Result<PgPool> {
    let opts = PgConnectOptions::from_str(url.expose())
        .map_err(|_| anyhow::anyhow!("DATABASE_URL is not a valid postgres:// URL"))?
        .application_name("onramp");
    pool_options(max_connections)
        .connect_with(opts)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", describe(url)))
}

pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("applying database migrations")?;
    Ok(())
}

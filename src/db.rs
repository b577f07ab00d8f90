//! The database: connecting (errors name the server, never the password) and migrations.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::config::Secret;

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

pub async fn connect(url: &Secret, max_connections: u32) -> anyhow::Result<PgPool> {
    let opts = PgConnectOptions::from_str(url.expose())
        .map_err(|_| anyhow::anyhow!("DATABASE_URL is not a valid postgres:// URL"))?
        .application_name("onramp");
    PgPoolOptions::new()
        .max_connections(max_connections.max(4))
        .acquire_timeout(Duration::from_secs(10))
        .connect_with(opts)
        .await
        .with_context(|| format!("cannot connect to PostgreSQL at {}", describe(url)))
}

pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    MIGRATOR.run(pool).await.context("applying database migrations")?;
    Ok(())
}

/// Slurm writes of every onramp process against one database go one at a time: a session-level
/// advisory lock on a connection of its own, released when the guard (the connection) is dropped
/// and the session ends, even if the step holding it is stopped mid-write.
pub struct PgWriteGate {
    opts: PgConnectOptions,
}

impl PgWriteGate {
    /// The advisory lock's key ("onramp slurm writes").
    pub const KEY: i64 = 0x6f6e_7261_6d70_5357;

    pub fn new(pool: &PgPool) -> Self {
        Self { opts: (*pool.connect_options()).clone() }
    }
}

impl crate::slurm::WriteGate for PgWriteGate {
    fn enter(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<crate::slurm::GateGuard, String>> + Send + '_>> {
        Box::pin(async move {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect_with(&self.opts).await.map_err(|e| e.to_string())?;
            sqlx::query("select pg_advisory_lock($1)")
                .bind(Self::KEY)
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Box::new(conn) as crate::slurm::GateGuard)
        })
    }
}

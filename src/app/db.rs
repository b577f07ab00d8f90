//! The database: connecting (errors name the server, never the password) and migrations.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

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

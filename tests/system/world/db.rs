//! The world's own PostgreSQL database (created at start, dropped at the end), on the shared
//! server or on a server of the world's own (`postgres::Server`, which a scenario can stop and
//! start), and what the test reads from it: the jobs' states and their step attempts.

use std::collections::BTreeMap;

use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

use super::postgres::{Server, Stop};

/// The server the world creates its database on (trust auth, a role allowed to create databases).
pub fn admin_url() -> String {
    std::env::var("ONRAMP_TEST_DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

pub struct Db {
    pub name: String,
    pub url: String,
    pub pool: PgPool,
    /// The world's own server, if it has one (else the database is on `admin_url()`'s).
    server: Option<Server>,
}

impl Db {
    pub async fn create(server: Option<Server>) -> Self {
        let admin = server.as_ref().map_or_else(admin_url, Server::admin_url);
        let name = format!("onramp_system_{}", uuid::Uuid::new_v4().simple());
        let mut conn = PgConnection::connect(&admin)
            .await
            .unwrap_or_else(|e| panic!("the system test needs PostgreSQL at {admin} (ONRAMP_TEST_DATABASE_URL): {e}"));
        sqlx::query(&format!("create database {name}")).execute(&mut conn).await.unwrap();
        let url = format!("{}/{name}", admin.rsplit_once('/').expect("a database URL").0);
        let pool = PgPoolOptions::new().max_connections(4).connect_lazy(&url).unwrap();
        Self { name, url, pool, server }
    }

    fn server(&self) -> &Server {
        self.server.as_ref().expect("only a world with its own PostgreSQL (Options::own_postgres) stops it")
    }

    /// Stops the world's own server (every onramp process loses its connections).
    pub async fn stop(&self, how: Stop) {
        self.server().stop(how).await;
    }

    pub async fn start(&self) {
        self.server().start().await;
    }

    /// Stops the world's own server now (before the world's directory, which holds its data, goes).
    pub fn shut_down(&self) {
        if let Some(s) = &self.server {
            s.stop_now();
        }
    }

    /// How many jobs of `kind` are in each state.
    pub async fn states(&self, kind: &str) -> BTreeMap<String, i64> {
        sqlx::query_as::<_, (String, i64)>("select state, count(*) from jobs where kind = $1 group by state")
            .bind(kind)
            .fetch_all(&self.pool)
            .await
            .unwrap()
            .into_iter()
            .collect()
    }

    /// The inputs of the jobs of `kind` in `state`.
    pub async fn inputs(&self, kind: &str, state: &str) -> Vec<serde_json::Value> {
        sqlx::query_scalar("select input from jobs where kind = $1 and state = $2 order by id")
            .bind(kind)
            .bind(state)
            .fetch_all(&self.pool)
            .await
            .unwrap()
    }

    /// Failed, cancelled or stuck jobs with their last error: what to look at when a run fails.
    pub async fn troubles(&self) -> Vec<(i64, String, String, String, Option<String>)> {
        sqlx::query_as(
            "select id, kind, state, step, last_error from jobs
             where state in ('failed', 'cancelled', 'needs_approval') or last_error is not null
             order by id limit 20",
        )
        .fetch_all(&self.pool)
        .await
        .unwrap_or_default()
    }

    /// The usernames whose onboarding `step` had an attempt cut short (the worker died in it).
    pub async fn interrupted(&self, step: &str) -> Vec<String> {
        sqlx::query_scalar(
            "select distinct j.input->>'username' from step_runs r join jobs j on j.id = r.job_id
             where j.kind = 'user.onboard' and r.step = $1 and r.outcome = 'lease_expired'",
        )
        .bind(step)
        .fetch_all(&self.pool)
        .await
        .unwrap()
    }

    /// Worker processes with their LISTEN connection up (then ready to claim).
    pub async fn listeners(&self) -> i64 {
        sqlx::query_scalar(
            "select count(*) from pg_stat_activity where datname = current_database() and query ilike 'listen%'",
        )
        .fetch_one(&self.pool)
        .await
        .unwrap()
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        if self.server.is_some() {
            return; // the server and its files go with the world
        }
        let name = self.name.clone();
        // Drop runs inside the test's runtime: use a thread with a runtime of its own.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                if let Ok(mut c) = PgConnection::connect(&admin_url()).await {
                    let _ = sqlx::query(&format!("drop database if exists {name} with (force)")).execute(&mut c).await;
                }
            });
        })
        .join();
    }
}

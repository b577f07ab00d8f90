//! The write gate in PostgreSQL: Slurm writes of every onramp process go one at a time
//! (slurmdbd 22.05 loses concurrent writes).

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, PgPool};

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
        // waiting here for another replica's write is the gate at work: sqlx would log each wait
        // over a second as a slow statement (a WARN line per write that queued)
        Self { opts: (*pool.connect_options()).clone().disable_statement_logging() }
    }
}

impl super::WriteGate for PgWriteGate {
    fn enter(
        &self,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<super::GateGuard, String>> + Send + '_>> {
        Box::pin(async move {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect_with(&self.opts).await.map_err(|e| e.to_string())?;
            sqlx::query("select pg_advisory_lock($1)")
                .bind(Self::KEY)
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
            Ok(Box::new(conn) as super::GateGuard)
        })
    }
}

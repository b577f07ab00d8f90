//! Named budgets: "at most `limit` per `window`", counted in the database so that every replica
//! shares one count. Jobs are enqueued through a budget: each new one takes a slot, and those
//! past the budget are not enqueued but *held* (with what the caller needs to act on them later)
//! until a person releases the held set through one release job. The engine knows nothing of what
//! a budget limits: the caller says which jobs take a slot and what a held one means.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sqlx::{PgConnection, PgPool};
use time::OffsetDateTime;

use super::store::{self, Enqueued, NewJob};
use super::{EngineError, Registry};

/// A named budget: at most `limit` slots granted in any `window`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Budget {
    pub name: String,
    pub limit: u64,
    pub window: Duration,
}

/// A job that takes a slot of the budget, unless an unfinished job with its dedupe key exists
/// already (then that job is answered and no slot is taken). Past the budget it is not enqueued
/// and `held` is kept under its dedupe key (or subject) until released.
#[derive(Clone, Debug)]
pub struct Metered {
    pub job: NewJob,
    pub held: Value,
}

impl Metered {
    pub fn new<T: Serialize>(job: NewJob, held: &T) -> Self {
        let held = serde_json::to_value(held).expect("a held item is plain data and serializes");
        Self { job, held }
    }

    fn key(&self) -> &str {
        self.job.dedupe_key.as_deref().unwrap_or(&self.job.subject)
    }
}

/// What to enqueue through a budget in one transaction.
#[derive(Clone, Debug, Default)]
pub struct Through<'a> {
    pub metered: &'a [Metered],
    /// Items held whatever the budget says (key, item): the caller's own check held them.
    pub hold: &'a [(String, Value)],
    /// Why metered items past the budget are held (kept with each, for the person releasing them).
    pub reason: &'a str,
    /// Why the `hold` items are held.
    pub hold_reason: &'a str,
    /// Enqueued when anything is held (its dedupe key makes it one job however often).
    pub release: Option<&'a NewJob>,
    /// Grant every slot even past the limit, and record them (a person released these).
    pub force: bool,
}

/// What became of the jobs sent through a budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThroughOutcome {
    /// Per metered job: the job (new or already there), or `None` when it was held.
    pub jobs: Vec<Option<Enqueued>>,
    /// The release job, when anything was held.
    pub release: Option<Enqueued>,
    /// Slots used in the window after this call, and the limit.
    pub used: u64,
    pub limit: u64,
}

/// An item a budget holds.
#[derive(Clone, Debug, PartialEq)]
pub struct Held<T> {
    pub id: i64,
    pub key: String,
    pub item: T,
    pub reason: String,
    pub held_at: OffsetDateTime,
}

/// Takes the budget's lock (its row, created on first use) until the caller's transaction ends.
async fn lock(conn: &mut PgConnection, name: &str) -> Result<(), EngineError> {
    sqlx::query("insert into budgets (name) values ($1) on conflict do nothing").bind(name).execute(&mut *conn).await?;
    sqlx::query("select name from budgets where name = $1 for update").bind(name).execute(&mut *conn).await?;
    Ok(())
}

/// Slots granted in the window, counted under the lock; grants long past it are removed.
async fn used(conn: &mut PgConnection, b: &Budget) -> Result<u64, EngineError> {
    let secs = b.window.as_secs_f64();
    sqlx::query(
        "delete from budget_grants
         where budget = $1 and granted_at < now() - greatest($2, 86400) * interval '1 second'",
    )
    .bind(&b.name)
    .bind(secs)
    .execute(&mut *conn)
    .await?;
    let n: i64 = sqlx::query_scalar(
        "select count(*) from budget_grants where budget = $1 and granted_at > now() - $2 * interval '1 second'",
    )
    .bind(&b.name)
    .bind(secs)
    .fetch_one(&mut *conn)
    .await?;
    Ok(u64::try_from(n).unwrap_or_default())
}

/// See [`super::Jobs::enqueue_through`].
pub(super) async fn enqueue_through(
    pool: &PgPool,
    registry: &Registry,
    budget: &Budget,
    t: &Through<'_>,
) -> Result<ThroughOutcome, EngineError> {
    let mut tx = pool.begin().await?;
    lock(&mut tx, &budget.name).await?;
    let keys: Vec<&str> = t.metered.iter().map(Metered::key).collect();
    let open: Vec<String> = sqlx::query_scalar(
        "select dedupe_key from jobs where dedupe_key = any($1) and queue_state not in ('succeeded', 'cancelled')",
    )
    .bind(&keys)
    .fetch_all(&mut *tx)
    .await?;
    let mut present: BTreeSet<&str> = open.iter().map(String::as_str).collect();
    let mut used = used(&mut tx, budget).await?;
    let (mut granted, mut go, mut held) = (vec![], vec![], vec![]);
    for (i, m) in t.metered.iter().enumerate() {
        let key = m.key();
        if present.contains(key) {
            go.push(i);
        } else if t.force || used < budget.limit {
            used += 1;
            granted.push(key);
            present.insert(key);
            go.push(i);
        } else {
            held.push((key.to_string(), m.held.clone(), t.reason));
        }
    }
    held.extend(t.hold.iter().map(|(k, v)| (k.clone(), v.clone(), t.hold_reason)));
    // one row per key (an upsert may touch a row once per statement)
    let mut seen = BTreeSet::new();
    held.retain(|h| seen.insert(h.0.clone()));
    sqlx::query("insert into budget_grants (budget, key) select $1, k from unnest($2::text[]) k")
        .bind(&budget.name)
        .bind(&granted)
        .execute(&mut *tx)
        .await?;
    // what now has its job is no longer held
    let enqueued_keys: Vec<&str> = go.iter().map(|&i| keys[i]).collect();
    sqlx::query("delete from budget_held where budget = $1 and key = any($2)")
        .bind(&budget.name)
        .bind(&enqueued_keys)
        .execute(&mut *tx)
        .await?;
    let held_keys: Vec<&str> = held.iter().map(|h| h.0.as_str()).collect();
    sqlx::query(
        "insert into budget_held (budget, key, item, reason)
         select $1, k, i, r from unnest($2::text[], $3::jsonb[], $4::text[]) x(k, i, r)
         on conflict (budget, key) do update set item = excluded.item, reason = excluded.reason",
    )
    .bind(&budget.name)
    .bind(&held_keys)
    .bind(held.iter().map(|h| &h.1).collect::<Vec<_>>())
    .bind(held.iter().map(|h| h.2).collect::<Vec<_>>())
    .execute(&mut *tx)
    .await?;
    let jobs: Vec<NewJob> = go.iter().map(|&i| t.metered[i].job.clone()).collect();
    let done = store::enqueue(&mut tx, registry, &jobs).await?;
    let mut by_index: HashMap<usize, Enqueued> = go.into_iter().zip(done).collect();
    let release = match (held_keys.is_empty(), t.release) {
        (false, Some(job)) => store::enqueue(&mut tx, registry, std::slice::from_ref(job)).await?.pop(),
        _ => None,
    };
    tx.commit().await?;
    let jobs = (0..t.metered.len()).map(|i| by_index.remove(&i)).collect();
    Ok(ThroughOutcome { jobs, release, used, limit: budget.limit })
}

/// The items a budget holds, oldest first. An item that does not fit `T` is an error.
pub(super) async fn held<T: DeserializeOwned>(pool: &PgPool, budget: &str) -> Result<Vec<Held<T>>, EngineError> {
    let rows: Vec<(i64, String, Value, String, OffsetDateTime)> =
        sqlx::query_as("select id, key, item, reason, held_at from budget_held where budget = $1 order by id")
            .bind(budget)
            .fetch_all(pool)
            .await?;
    rows.into_iter()
        .map(|(id, key, item, reason, held_at)| {
            let item = serde_json::from_value(item)
                .map_err(|e| EngineError::Corrupt(format!("held item {key:?} of budget {budget}: {e}")))?;
            Ok(Held { id, key, item, reason, held_at })
        })
        .collect()
}

/// Forgets held items (they were released); returns how many were removed.
pub(super) async fn forget(pool: &PgPool, budget: &str, ids: &[i64]) -> Result<u64, EngineError> {
    let r = sqlx::query("delete from budget_held where budget = $1 and id = any($2)")
        .bind(budget)
        .bind(ids)
        .execute(pool)
        .await?;
    Ok(r.rows_affected())
}

impl super::Engine {
    /// Enqueues jobs through a budget in one transaction: each metered job that has no unfinished
    /// job yet takes a slot; past the limit it is held instead, with `through.hold`, and the
    /// release job is enqueued. Two replicas never both take the last slot.
    pub async fn enqueue_through(&self, budget: &Budget, through: &Through<'_>) -> Result<ThroughOutcome, EngineError> {
        enqueue_through(self.pool(), self.registry(), budget, through).await
    }

    /// The items a budget holds, oldest first.
    pub async fn held<T: DeserializeOwned>(&self, budget: &str) -> Result<Vec<Held<T>>, EngineError> {
        held(self.pool(), budget).await
    }

    /// Forgets released items of a budget.
    pub async fn forget_held(&self, budget: &str, ids: &[i64]) -> Result<u64, EngineError> {
        forget(self.pool(), budget, ids).await
    }
}

/// The same for steps, through their handle on other jobs.
impl super::Jobs {
    pub async fn enqueue_through(&self, budget: &Budget, through: &Through<'_>) -> Result<ThroughOutcome, EngineError> {
        self.0.enqueue_through(budget, through).await
    }

    pub async fn held<T: DeserializeOwned>(&self, budget: &str) -> Result<Vec<Held<T>>, EngineError> {
        self.0.held(budget).await
    }

    pub async fn forget_held(&self, budget: &str, ids: &[i64]) -> Result<u64, EngineError> {
        self.0.forget_held(budget, ids).await
    }
}

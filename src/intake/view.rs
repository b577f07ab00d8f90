//! A stored delivery as the API shows it: what it pointed at, whether the pump has processed it,
//! and the jobs it led to (created for it, or pending ones it was folded into). Never its body.

use serde::Serialize;
use serde_json::Value;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::engine::{Engine, EngineError, JobStanding};

#[derive(Clone, Debug, Serialize)]
pub struct DeliveryView {
    pub id: Uuid,
    #[serde(with = "time::serde::rfc3339")]
    pub received_at: OffsetDateTime,
    /// structured | default | unknown
    pub shape: String,
    pub action: Option<String>,
    pub model: Option<String>,
    /// Whom it pointed at: `user:<pk>`, `group:<name>`, `everything`.
    pub targets: Value,
    /// pending (the pump has not taken it yet) | processed
    pub status: &'static str,
    #[serde(with = "time::serde::rfc3339::option")]
    pub processed_at: Option<OffsetDateTime>,
    /// Why its jobs could not be enqueued (PostgreSQL refused them), when so.
    pub error: Option<String>,
    pub jobs: Vec<JobRef>,
}

#[derive(Clone, Debug, Serialize)]
pub struct JobRef {
    pub id: i64,
    pub kind: String,
    pub state: String,
}

type Row = (
    Uuid,
    OffsetDateTime,
    String,
    Option<String>,
    Option<String>,
    Value,
    Option<OffsetDateTime>,
    Option<String>,
    Option<Vec<i64>>,
);

/// The delivery `id`, if stored (still kept: see `retention`).
pub async fn delivery(engine: &Engine, id: Uuid) -> Result<Option<DeliveryView>, EngineError> {
    let row: Option<Row> = sqlx::query_as(
        "select id, received_at, shape, action, model, targets, processed_at, pump_error, job_ids
         from webhook_deliveries where id = $1",
    )
    .bind(id)
    .fetch_optional(engine.pool())
    .await?;
    let Some((id, received_at, shape, action, model, targets, processed_at, error, job_ids)) = row else {
        return Ok(None);
    };
    let ids = job_ids.unwrap_or_default();
    let standings: Vec<JobStanding> = engine.standings(&ids).await?;
    // in the order the pump recorded them; a job pruned since is left out
    let jobs = ids
        .iter()
        .filter_map(|id| standings.iter().find(|s| s.id == *id))
        .map(|s| JobRef { id: s.id, kind: s.kind.clone(), state: s.state.as_str().to_string() })
        .collect();
    let status = if processed_at.is_some() { "processed" } else { "pending" };
    Ok(Some(DeliveryView { id, received_at, shape, action, model, targets, status, processed_at, error, jobs }))
}

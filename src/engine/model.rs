//! The engine's records as the rest of the service reads them.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use serde_json::Value;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, PgValueRef, Postgres};
use sqlx::{Decode, Encode};
use time::OffsetDateTime;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Running,
    Waiting,
    NeedsApproval,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobState {
    pub const ALL: [JobState; 7] = [
        Self::Pending,
        Self::Running,
        Self::Waiting,
        Self::NeedsApproval,
        Self::Succeeded,
        Self::Failed,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Waiting => "waiting",
            Self::NeedsApproval => "needs_approval",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }

    /// Succeeded and cancelled jobs are closed: they no longer hold their subject or dedupe key.
    /// A failed job stays open until a human retries or cancels it.
    pub fn is_closed(self) -> bool {
        matches!(self, Self::Succeeded | Self::Cancelled)
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|st| st.as_str() == s).ok_or_else(|| format!("unknown job state {s:?}"))
    }
}

/// How one attempt of a step ended, as its `step_runs` row records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    Done,
    Retry,
    Wait,
    Poll,
    Fail,
    NeedsApproval,
    /// The worker stopped renewing its lease; another worker reclaimed the step.
    LeaseExpired,
    /// The worker gave the step back at shutdown.
    Released,
    Cancelled,
}

impl StepOutcome {
    pub const ALL: [StepOutcome; 9] = [
        Self::Done,
        Self::Retry,
        Self::Wait,
        Self::Poll,
        Self::Fail,
        Self::NeedsApproval,
        Self::LeaseExpired,
        Self::Released,
        Self::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Done => "done",
            Self::Retry => "retry",
            Self::Wait => "wait",
            Self::Poll => "poll",
            Self::Fail => "fail",
            Self::NeedsApproval => "needs_approval",
            Self::LeaseExpired => "lease_expired",
            Self::Released => "released",
            Self::Cancelled => "cancelled",
        }
    }
}

impl fmt::Display for StepOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StepOutcome {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL.into_iter().find(|o| o.as_str() == s).ok_or_else(|| format!("unknown step outcome {s:?}"))
    }
}

/// Stored as their text names: decoded from and bound as `text` (and `text[]`).
macro_rules! text_column {
    ($t:ty) => {
        impl sqlx::Type<Postgres> for $t {
            fn type_info() -> PgTypeInfo {
                <&str as sqlx::Type<Postgres>>::type_info()
            }
            fn compatible(ty: &PgTypeInfo) -> bool {
                <&str as sqlx::Type<Postgres>>::compatible(ty)
            }
        }
        impl PgHasArrayType for $t {
            fn array_type_info() -> PgTypeInfo {
                <&str as PgHasArrayType>::array_type_info()
            }
        }
        impl<'r> Decode<'r, Postgres> for $t {
            fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
                Ok(<&str as Decode<Postgres>>::decode(value)?.parse::<$t>()?)
            }
        }
        impl Encode<'_, Postgres> for $t {
            fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                <&str as Encode<Postgres>>::encode(self.as_str(), buf)
            }
        }
    };
}
text_column!(JobState);
text_column!(StepOutcome);

/// Who or what caused a change: recorded with every audit entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Actor(String);

impl Actor {
    pub fn worker(id: &str) -> Self {
        Self(format!("worker:{id}"))
    }
    pub fn api(token_name: &str) -> Self {
        Self(format!("api:{token_name}"))
    }
    pub fn webhook(delivery: &str) -> Self {
        Self(format!("webhook:{delivery}"))
    }
    pub fn reconciler() -> Self {
        Self("reconciler".into())
    }
    pub fn cli(user: &str) -> Self {
        Self(format!("cli:{user}"))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct Job {
    pub id: i64,
    pub kind: String,
    pub subject: String,
    /// The first segment of the subject.
    pub tenant: String,
    pub dedupe_key: Option<String>,
    pub state: JobState,
    pub input: Value,
    pub outputs: Value,
    pub step_index: i32,
    pub step: String,
    pub attempt: i32,
    #[serde(with = "time::serde::rfc3339")]
    pub run_at: OffsetDateTime,
    pub lease_owner: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub poll_deadline: Option<OffsetDateTime>,
    pub approved_by: Option<String>,
    pub last_error: Option<String>,
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339")]
    pub updated_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct StepRun {
    pub id: i64,
    pub job_id: i64,
    pub step_index: i32,
    pub step: String,
    pub attempt: i32,
    pub worker: String,
    #[serde(with = "time::serde::rfc3339")]
    pub started_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub finished_at: Option<OffsetDateTime>,
    pub outcome: Option<StepOutcome>,
    pub error: Option<String>,
    pub output: Option<Value>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub next_run_at: Option<OffsetDateTime>,
    /// The commands and requests the attempt made: `[{system, call, write}]`.
    pub effects: Option<Value>,
}

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct JobEvent {
    pub id: i64,
    pub job_id: i64,
    #[serde(with = "time::serde::rfc3339")]
    pub at: OffsetDateTime,
    pub from_state: Option<JobState>,
    pub to_state: JobState,
    pub step: Option<String>,
    pub actor: String,
    pub detail: Option<String>,
}

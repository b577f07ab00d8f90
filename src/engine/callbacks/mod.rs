//! Callbacks: subscriptions to job events, delivered by the workers as Standard Webhooks-signed
//! POSTs — durable, at least once, in order per subscription, retried with backoff.
//!
//! A subscription names a URL, optionally a tenant (the first segment of a job's subject) and the
//! event types it wants (`job.<state entered>`). It keeps a cursor into `job_events`; a worker
//! holds a due subscription by a lease, reads the events after its cursor ([`log`]), and posts
//! the matching ones one at a time, moving the cursor after each success. A failure leaves the
//! cursor where it is and schedules the next attempt (exponential backoff, or the receiver's
//! `Retry-After` on 429 and 503); after the last attempt the event is given up on and counted.
//! Each event is signed with the subscription's secret and carries `webhook-id: evt_<event id>`,
//! the same on every attempt, for the receiver to drop duplicates.

mod deliver;
mod dispatch;
pub mod log;
mod store;

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;
use time::OffsetDateTime;

use super::{Engine, EngineError, JobState};

pub use deliver::sign;
pub use log::{EventSummary, Hold, LoggedEvent, settled};

/// A subscription's signing secret, `whsec_<base64>`: never printed, shown once at creation.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// What a subscription can ask for: a job entering a state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EventType(pub JobState);

impl EventType {
    /// Asked for when a subscription names none: a job finished or needs a person.
    pub const DEFAULT: [EventType; 4] = [
        EventType(JobState::Succeeded),
        EventType(JobState::Failed),
        EventType(JobState::NeedsApproval),
        EventType(JobState::Cancelled),
    ];

    pub fn name(self) -> String {
        format!("job.{}", self.0.as_str())
    }
}

impl fmt::Display for EventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "job.{}", self.0.as_str())
    }
}

impl FromStr for EventType {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let names = || JobState::ALL.iter().map(|st| format!("job.{st}")).collect::<Vec<_>>().join(", ");
        let state = s.strip_prefix("job.").and_then(|st| st.parse().ok());
        state.map(EventType).ok_or_else(|| format!("unknown event type {s:?}: one of {}", names()))
    }
}

/// A new subscription, checked by the caller (the URL is checked here).
#[derive(Clone, Debug)]
pub struct NewSubscription {
    pub url: String,
    pub tenant: Option<String>,
    pub events: Vec<EventType>,
    pub created_by: String,
}

/// A subscription as the API shows it: never its secret.
#[derive(Clone, Debug, Serialize)]
pub struct Subscription {
    pub id: i64,
    pub url: String,
    pub tenant: Option<String>,
    pub events: Vec<String>,
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    /// Every event up to this id is done (delivered, given up on, or not asked for).
    pub cursor: i64,
    /// Failed attempts of the next event.
    pub attempts: i32,
    #[serde(with = "time::serde::rfc3339")]
    pub next_attempt_at: OffsetDateTime,
    pub delivered: i64,
    pub given_up: i64,
    pub last_status: Option<i32>,
    pub last_error: Option<String>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_attempt_at: Option<OffsetDateTime>,
}

/// How the workers deliver callbacks.
#[derive(Clone, Debug)]
pub struct CallbackConfig {
    /// Recorded as the lease owner.
    pub worker: String,
    /// One POST, connecting included.
    pub timeout: Duration,
    /// Attempts of one event before it is given up on.
    pub max_attempts: u32,
    /// The first retry's delay; doubled per attempt up to `max_backoff`.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// How often idle workers look for new events.
    pub poll: Duration,
    /// How long a missing event id is waited for (see [`log`]).
    pub settle: Duration,
}

impl Default for CallbackConfig {
    fn default() -> Self {
        Self {
            worker: "onramp".into(),
            timeout: Duration::from_secs(10),
            max_attempts: 12,
            backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(600),
            poll: Duration::from_secs(1),
            settle: Duration::from_secs(30),
        }
    }
}

/// Why a subscription was refused.
#[derive(Debug, thiserror::Error)]
pub enum SubscriptionError {
    #[error("url must be an http:// or https:// URL without user or password: {0}")]
    BadUrl(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl Engine {
    /// Creates a subscription starting after the newest event; returns it with its signing
    /// secret (`whsec_…`), which is never shown again.
    pub async fn create_subscription(
        &self,
        new: &NewSubscription,
    ) -> Result<(Subscription, Secret), SubscriptionError> {
        check_url(&new.url)?;
        let secret = new_secret();
        let sub = store::create(self.pool(), new, &secret).await?;
        Ok((sub, secret))
    }

    pub async fn subscriptions(&self) -> Result<Vec<Subscription>, EngineError> {
        store::list(self.pool()).await
    }

    /// Deletes a subscription; false when there is none by that id.
    pub async fn delete_subscription(&self, id: i64) -> Result<bool, EngineError> {
        store::delete(self.pool(), id).await
    }

    /// The audit trail after `after` (at most `limit` events, the newest when there are more),
    /// each with its job as it is now, up to `upto`.
    pub async fn events_after(&self, after: i64, upto: i64, limit: i64) -> Result<Vec<LoggedEvent>, EngineError> {
        log::read(self.pool(), after, Some(upto), limit, true).await
    }

    /// The next events after `after`, oldest first, at most `limit`.
    pub async fn next_events(&self, after: i64, limit: i64) -> Result<Vec<LoggedEvent>, EngineError> {
        log::read(self.pool(), after, None, limit, false).await
    }

    /// The newest event's id (0 when there is none).
    pub async fn last_event_id(&self) -> Result<i64, EngineError> {
        log::last_id(self.pool()).await
    }

    /// Delivers callbacks until `shutdown` is cancelled (several workers may run this at once).
    pub async fn run_callbacks(&self, cfg: CallbackConfig, shutdown: tokio_util::sync::CancellationToken) {
        dispatch::run(self.clone(), cfg, shutdown).await
    }
}

fn check_url(url: &str) -> Result<(), SubscriptionError> {
    let bad = || SubscriptionError::BadUrl(url.chars().take(200).collect());
    let u = reqwest::Url::parse(url).map_err(|_| bad())?;
    let ok = matches!(u.scheme(), "http" | "https")
        && u.host_str().is_some()
        && u.username().is_empty()
        && u.password().is_none()
        && url.len() <= 2000;
    ok.then_some(()).ok_or_else(bad)
}

/// 32 random bytes (from the OS, through UUIDv4), as `whsec_<base64>`.
fn new_secret() -> Secret {
    use base64::Engine as _;
    let mut key = Vec::with_capacity(32);
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    key.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    Secret::new(format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(key)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_types_parse_by_name() {
        assert_eq!("job.succeeded".parse::<EventType>().unwrap(), EventType(JobState::Succeeded));
        assert_eq!(EventType(JobState::NeedsApproval).to_string(), "job.needs_approval");
        let e = "job.done".parse::<EventType>().unwrap_err();
        assert!(e.contains("job.succeeded") && e.contains("\"job.done\""), "{e}");
    }

    #[test]
    fn urls_are_http_without_credentials() {
        assert!(check_url("https://portal.example.org/hooks/onramp?x=1").is_ok());
        assert!(check_url("http://127.0.0.1:8080/").is_ok());
        for bad in ["ftp://x/", "https://user:pw@x/", "not a url", "file:///etc/passwd"] {
            assert!(check_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_are_whsec_of_32_bytes() {
        use base64::Engine as _;
        let s = new_secret();
        let key = base64::engine::general_purpose::STANDARD.decode(s.expose().strip_prefix("whsec_").unwrap());
        assert_eq!(key.unwrap().len(), 32);
        assert_ne!(new_secret(), s);
        assert_eq!(format!("{s:?}"), "[redacted]");
    }
}

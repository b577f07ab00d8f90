//! Authentik's REST API (`/api/v3`), the few calls onramp needs: read a user (by pk or username),
//! list a group's active members (all pages), deactivate a user. Timeouts, retries on 5xx/429 and
//! transport errors honouring `Retry-After`, and typed errors: not found is an answer, not a
//! failure to retry.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use crate::domain::secret::Secret;

#[derive(Clone, Debug)]
pub struct AuthentikConfig {
    /// e.g. `https://auth.example.org` (the client adds `/api/v3`).
    pub url: String,
    pub token: Secret,
    /// Per request.
    pub timeout: Duration,
    /// Attempts in all for a retryable failure.
    pub attempts: u32,
    /// First retry delay; doubles each time.
    pub backoff: Duration,
    pub page_size: u32,
    /// Requests in flight at once per process; the rest wait their turn (a thousand user
    /// reconciles at once do not open a thousand connections to Authentik).
    pub concurrency: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthentikError {
    #[error("Authentik has no {0}")]
    NotFound(String),
    #[error("Authentik refused the token ({0}): check ONRAMP_AUTHENTIK_TOKEN")]
    Unauthorized(u16),
    #[error("Authentik answered {status} to {what}")]
    Status { status: u16, what: String },
    #[error("Authentik unreachable for {what} after {attempts} attempts: {reason}")]
    Unavailable { what: String, attempts: u32, reason: String },
    #[error("Authentik's answer to {what} does not parse: {reason}")]
    Decode { what: String, reason: String },
}

impl AuthentikError {
    /// Worth trying again later (a reconcile step retries; a not-found is final).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
            || matches!(self, Self::Status { status, .. } if *status >= 500 || *status == 429)
    }
    pub fn kind(&self) -> &'static str {
        match self {
            Self::NotFound(_) => "not_found",
            Self::Unauthorized(_) => "unauthorized",
            Self::Status { .. } => "status",
            Self::Unavailable { .. } => "unavailable",
            Self::Decode { .. } => "decode",
        }
    }
}

/// A user as `/core/users/` returns it (the fields onramp reads).
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct User {
    pub pk: i64,
    pub username: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub email: String,
    pub is_active: bool,
    /// Group uuids.
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub groups_obj: Option<Vec<GroupRef>>,
    #[serde(default)]
    pub attributes: Value,
    #[serde(default)]
    pub uuid: Option<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct GroupRef {
    pub pk: String,
    pub name: String,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Group {
    pub pk: String,
    pub name: String,
}

impl User {
    /// Whether the answer says which groups the user is in (by name). Without `groups_obj`,
    /// a user with groups must not be judged to be in none.
    pub fn knows_group_names(&self) -> bool {
        self.groups_obj.is_some() || self.groups.is_empty()
    }

    /// Names of the user's groups (from `groups_obj`).
    pub fn group_names(&self) -> Vec<String> {
        self.groups_obj.iter().flatten().map(|g| g.name.clone()).collect()
    }

    /// `attributes.sshPublicKey`: a string (possibly several lines) or a list of strings.
    pub fn ssh_keys(&self) -> Vec<String> {
        match self.attributes.get("sshPublicKey") {
            Some(Value::String(s)) => s.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect(),
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_str)
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_string)
                .collect(),
            _ => vec![],
        }
    }
}

#[derive(Deserialize)]
struct Page<T> {
    pagination: Pagination,
    results: Vec<T>,
}

#[derive(Deserialize)]
struct Pagination {
    /// The next page's number, 0 on the last page.
    #[serde(default)]
    next: u64,
}

pub type AuthentikFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, AuthentikError>> + Send + 'a>>;

/// The Authentik calls the reconciler and the flows make, as one trait, so that a plan or a dry
/// run can stand in for the real API. [`AuthentikClient`] is the one real implementation.
pub trait Authentik: Send + Sync {
    fn user(&self, pk: i64) -> AuthentikFuture<'_, User>;
    fn user_by_username<'a>(&'a self, username: &'a str) -> AuthentikFuture<'a, User>;
    /// Active members of a group, every page; a group that does not exist is an error.
    fn active_members<'a>(&'a self, group: &'a str) -> AuthentikFuture<'a, Vec<User>>;
    /// `PATCH is_active=false`: login blocked, record kept.
    fn deactivate(&self, pk: i64) -> AuthentikFuture<'_, User>;
}

impl Authentik for AuthentikClient {
    fn user(&self, pk: i64) -> AuthentikFuture<'_, User> {
        Box::pin(AuthentikClient::user(self, pk))
    }
    fn user_by_username<'a>(&'a self, username: &'a str) -> AuthentikFuture<'a, User> {
        Box::pin(AuthentikClient::user_by_username(self, username))
    }
    fn active_members<'a>(&'a self, group: &'a str) -> AuthentikFuture<'a, Vec<User>> {
        Box::pin(AuthentikClient::active_members(self, group))
    }
    fn deactivate(&self, pk: i64) -> AuthentikFuture<'_, User> {
        Box::pin(AuthentikClient::deactivate(self, pk))
    }
}

#[derive(Clone)]
pub struct AuthentikClient {
    http: reqwest::Client,
    base: String,
    cfg: AuthentikConfig,
    in_flight: Arc<Semaphore>,
}

impl AuthentikClient {
    pub fn new(cfg: AuthentikConfig) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout.min(Duration::from_secs(10)))
            .user_agent(concat!("onramp/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
        let base = format!("{}/api/v3", cfg.url.trim_end_matches('/').trim_end_matches("/api/v3"));
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(format!("ONRAMP_AUTHENTIK_URL {:?} is not an http(s) URL", cfg.url));
        }
        let in_flight = Arc::new(Semaphore::new(cfg.concurrency.max(1)));
        Ok(Self { http, base, cfg, in_flight })
    }

    pub async fn user(&self, pk: i64) -> Result<User, AuthentikError> {
        let q = [("include_groups", "true".to_string())];
        self.get(&format!("/core/users/{pk}/"), &q, &format!("user {pk}")).await
    }

    pub async fn user_by_username(&self, username: &str) -> Result<User, AuthentikError> {
        let what = format!("user {username:?}");
        let page: Page<User> = self
            .get("/core/users/", &[("username", username.to_string()), ("include_groups", "true".to_string())], &what)
            .await?;
        page.results.into_iter().find(|u| u.username == username).ok_or(AuthentikError::NotFound(what))
    }

    pub async fn group_by_name(&self, name: &str) -> Result<Group, AuthentikError> {
        let what = format!("group {name:?}");
        let page: Page<Group> = self.get("/core/groups/", &[("name", name.to_string())], &what).await?;
        page.results.into_iter().find(|g| g.name == name).ok_or(AuthentikError::NotFound(what))
    }

    /// Active members of a group, every page. A group that does not exist is an error, never
    /// an empty list.
    pub async fn active_members(&self, group: &str) -> Result<Vec<User>, AuthentikError> {
        self.group_by_name(group).await?;
        let what = format!("members of group {group:?}");
        let mut out = vec![];
        let mut page_no = 1u64;
        loop {
            let q = [
                ("groups_by_name", group.to_string()),
                ("is_active", "true".to_string()),
                ("page", page_no.to_string()),
                ("page_size", self.cfg.page_size.to_string()),
                ("ordering", "pk".to_string()),
            ];
            let page: Page<User> = self.get("/core/users/", &q, &what).await?;
            out.extend(page.results);
            if page.pagination.next == 0 || page.pagination.next <= page_no || page_no > 100_000 {
                break;
            }
            page_no = page.pagination.next;
        }
        Ok(out)
    }

    /// `PATCH is_active=false`: login blocked, record kept.
    pub async fn deactivate(&self, pk: i64) -> Result<User, AuthentikError> {
        self.send(
            Method::PATCH,
            &format!("/core/users/{pk}/"),
            &[],
            Some(json!({"is_active": false})),
            &format!("user {pk}"),
        )
        .await
    }

    async fn get<T: DeserializeOwned>(
        &self,
        path: &str,
        q: &[(&str, String)],
        what: &str,
    ) -> Result<T, AuthentikError> {
        self.send(Method::GET, path, q, None, what).await
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        q: &[(&str, String)],
        body: Option<Value>,
        what: &str,
    ) -> Result<T, AuthentikError> {
        let url = format!("{}{path}", self.base);
        let attempts = self.cfg.attempts.max(1);
        let mut delay = self.cfg.backoff;
        let mut last = String::new();
        for attempt in 1..=attempts {
            let mut req = self.http.request(method.clone(), &url).query(q).bearer_auth(self.cfg.token.expose());
            if let Some(b) = &body {
                req = req.json(b);
            }
            // a turn per attempt, given back before a retry's delay
            let turn = self.in_flight.acquire().await.expect("the semaphore is never closed");
            let wait = match req.send().await {
                Ok(res) => {
                    let status = res.status();
                    if status.is_success() {
                        let bytes = res
                            .bytes()
                            .await
                            .map_err(|e| AuthentikError::Decode { what: what.into(), reason: e.to_string() })?;
                        return serde_json::from_slice(&bytes)
                            .map_err(|e| AuthentikError::Decode { what: what.into(), reason: e.to_string() });
                    }
                    match status {
                        StatusCode::NOT_FOUND => return Err(AuthentikError::NotFound(what.into())),
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                            return Err(AuthentikError::Unauthorized(status.as_u16()));
                        }
                        s if s.is_server_error() || s == StatusCode::TOO_MANY_REQUESTS => {
                            last = format!("status {}", s.as_u16());
                            retry_after(res.headers()).map(|d| d.min(Duration::from_secs(60)))
                        }
                        s => {
                            return Err(AuthentikError::Status { status: s.as_u16(), what: what.into() });
                        }
                    }
                }
                Err(e) => {
                    last = if e.is_timeout() { "timed out".into() } else { format!("{e}") };
                    None
                }
            };
            drop(turn);
            if attempt == attempts {
                break;
            }
            let d = wait.unwrap_or(delay);
            tracing::debug!(%what, attempt, delay_ms = d.as_millis() as u64, reason = %last, "retrying Authentik");
            tokio::time::sleep(d).await;
            delay = (delay * 2).min(Duration::from_secs(10));
        }
        Err(AuthentikError::Unavailable { what: what.into(), attempts, reason: last })
    }
}

/// `Retry-After` in seconds (the HTTP-date form is rare from Authentik and ignored).
fn retry_after(h: &reqwest::header::HeaderMap) -> Option<Duration> {
    h.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssh_keys_come_as_string_or_list() {
        let mut u: User = serde_json::from_value(json!({"pk": 1, "username": "a", "is_active": true,
            "attributes": {"sshPublicKey": "ssh-ed25519 AAA a@x\n\nssh-rsa BBB a@y\n"}}))
        .unwrap();
        assert_eq!(u.ssh_keys(), ["ssh-ed25519 AAA a@x", "ssh-rsa BBB a@y"]);
        u.attributes = json!({"sshPublicKey": ["ssh-ed25519 AAA", " "]});
        assert_eq!(u.ssh_keys(), ["ssh-ed25519 AAA"]);
        u.attributes = json!({});
        assert!(u.ssh_keys().is_empty());
    }

    #[test]
    fn a_user_without_groups_obj_is_not_taken_for_a_user_in_no_group() {
        let mut u: User = serde_json::from_value(json!({"pk": 1, "username": "a", "is_active": true,
            "groups": ["9a4f0c2e1b7d4e3f8a6b5c4d3e2f1a0b"]}))
        .unwrap();
        assert!(!u.knows_group_names());
        u.groups.clear();
        assert!(u.knows_group_names());
    }

    #[test]
    fn transient_errors_are_told_apart() {
        assert!(!AuthentikError::NotFound("x".into()).is_transient());
        assert!(AuthentikError::Status { status: 503, what: "x".into() }.is_transient());
        assert!(!AuthentikError::Status { status: 400, what: "x".into() }.is_transient());
    }
}

//! Clients of the fakes' control APIs, for a test driving standalone fakes from another process.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::authentik::FakeUser;
use crate::authentik::control::FailNext;
use crate::chaos::{ChaosReport, ChaosSpec};
use crate::k8s::control::{FaultSpec, Request};
use crate::k8s::{Access, Exec, Projection};

/// A control request that failed: transport, or an answer other than 2xx.
#[derive(Debug)]
pub struct ControlError(pub String);

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "fake control API: {}", self.0)
    }
}

impl std::error::Error for ControlError {}

pub type Result<T> = std::result::Result<T, ControlError>;

#[derive(Clone)]
struct Control {
    base: String,
    http: reqwest::Client,
}

impl Control {
    fn new(url: &str) -> Self {
        Self { base: format!("{}/_fake", url.trim_end_matches('/')), http: reqwest::Client::new() }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let r = req.send().await.map_err(|e| ControlError(e.to_string()))?;
        if r.status().is_success() {
            Ok(r)
        } else {
            let (status, body) = (r.status(), r.text().await.unwrap_or_default());
            Err(ControlError(format!("{status}: {body}")))
        }
    }

    async fn get<T: DeserializeOwned>(&self, path: &str, query: &[(&str, &str)]) -> Result<T> {
        let r = self.send(self.http.get(format!("{}{path}", self.base)).query(query)).await?;
        r.json().await.map_err(|e| ControlError(e.to_string()))
    }

    async fn post(&self, path: &str, body: &impl Serialize) -> Result<()> {
        self.send(self.http.post(format!("{}{path}", self.base)).json(body)).await.map(drop)
    }

    async fn delete(&self, path: &str) -> Result<()> {
        self.send(self.http.delete(format!("{}{path}", self.base))).await.map(drop)
    }

    /// `Some(spec)`: fail a share of the API requests from now on; `None`: stop.
    async fn chaos(&self, spec: Option<&ChaosSpec>) -> Result<()> {
        match spec {
            Some(s) => self.post("/chaos", s).await,
            None => self.delete("/chaos").await,
        }
    }
}

/// A fake Kubernetes API server in another process.
#[derive(Clone)]
pub struct K8sControl {
    c: Control,
    pub url: String,
}

impl K8sControl {
    pub fn new(url: &str) -> Self {
        Self { c: Control::new(url), url: url.into() }
    }

    /// Stores an object at its URL (e.g. `/api/v1/namespaces/t/secrets/x`).
    pub async fn put(&self, url: &str, obj: &Value) -> Result<()> {
        self.c.send(self.c.http.put(format!("{}/object", self.c.base)).query(&[("url", url)]).json(obj)).await.map(drop)
    }

    pub async fn get(&self, url: &str) -> Result<Option<Value>> {
        let r = self.c.http.get(format!("{}/object", self.c.base)).query(&[("url", url)]).send().await;
        let r = r.map_err(|e| ControlError(e.to_string()))?;
        if r.status() == reqwest::StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let r = r.error_for_status().map_err(|e| ControlError(e.to_string()))?;
        r.json().await.map(Some).map_err(|e| ControlError(e.to_string()))
    }

    /// The objects whose URL starts with `prefix`, by URL.
    pub async fn objects(&self, prefix: &str) -> Result<BTreeMap<String, Value>> {
        self.c.get("/objects", &[("prefix", prefix)]).await
    }

    pub async fn pod(&self, ns: &str, name: &str, labels: Value, ready: bool) -> Result<()> {
        self.c.post("/pods", &json!({"namespace": ns, "name": name, "labels": labels, "ready": ready})).await
    }

    pub async fn deployment(&self, ns: &str, name: &str, labels: Value) -> Result<()> {
        self.c.post("/deployments", &json!({"namespace": ns, "name": name, "labels": labels})).await
    }

    /// Projects a Secret into a directory from now on, as kubelet would.
    pub async fn project(&self, p: &Projection) -> Result<()> {
        self.c.post("/projections", p).await
    }

    pub async fn fault(&self, f: &FaultSpec) -> Result<()> {
        self.c.post("/faults", f).await
    }

    /// `Some(spec)`: fail a share of the API requests from now on; `None`: stop.
    pub async fn chaos(&self, spec: Option<&ChaosSpec>) -> Result<()> {
        self.c.chaos(spec).await
    }

    /// The faults the chaos injected since it was set.
    pub async fn chaos_report(&self) -> Result<ChaosReport> {
        self.c.get("/chaos", &[]).await
    }

    /// RBAC refuses `access` from now on.
    pub async fn forbid(&self, access: &Access) -> Result<()> {
        self.c.post("/forbid", access).await
    }

    /// Deletes namespace `ns` and everything in it.
    pub async fn delete_namespace(&self, ns: &str) -> Result<()> {
        self.c.delete(&format!("/namespaces/{ns}")).await
    }

    pub async fn requests(&self) -> Result<Vec<Request>> {
        self.c.get("/requests", &[]).await
    }

    pub async fn execs(&self) -> Result<Vec<Exec>> {
        self.c.get("/execs", &[]).await
    }

    /// `{content_type, path, body}` of each PATCH.
    pub async fn patches(&self) -> Result<Vec<Value>> {
        self.c.get("/patches", &[]).await
    }
}

/// A fake Authentik in another process.
#[derive(Clone)]
pub struct AuthentikControl {
    c: Control,
    pub url: String,
}

impl AuthentikControl {
    pub fn new(url: &str) -> Self {
        Self { c: Control::new(url), url: url.into() }
    }

    /// Adds (or replaces, by pk) users.
    pub async fn add_users(&self, users: &[FakeUser]) -> Result<()> {
        self.c.post("/users", &users).await
    }

    pub async fn users(&self) -> Result<Vec<FakeUser>> {
        self.c.get("/users", &[]).await
    }

    pub async fn add_groups(&self, names: &[&str]) -> Result<()> {
        self.c.post("/groups", &names).await
    }

    pub async fn groups(&self) -> Result<Vec<String>> {
        self.c.get("/groups", &[]).await
    }

    /// The next API requests get these answers before the real one.
    pub async fn fail_next(&self, answers: &[FailNext]) -> Result<()> {
        self.c.post("/faults", &answers).await
    }

    /// Drops the answers `fail_next` queued that were not given yet.
    pub async fn clear_faults(&self) -> Result<()> {
        self.c.send(self.c.http.delete(format!("{}/faults", self.c.base))).await.map(drop)
    }

    /// `Some(spec)`: fail a share of the API requests from now on; `None`: stop.
    pub async fn chaos(&self, spec: Option<&ChaosSpec>) -> Result<()> {
        self.c.chaos(spec).await
    }

    /// The faults the chaos injected since it was set.
    pub async fn chaos_report(&self) -> Result<ChaosReport> {
        self.c.get("/chaos", &[]).await
    }

    pub async fn requests(&self) -> Result<Vec<String>> {
        self.c.get("/requests", &[]).await
    }
}

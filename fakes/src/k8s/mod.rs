//! A fake Kubernetes API server that the real `kube` client talks to over HTTP: objects kept as
//! JSON by URL, GET/list (label selectors), server-side apply, merge patch, DELETE, `Status`
//! bodies for errors, and exec over WebSocket (v4/v5) running the argv as a local process and
//! streaming its real output and exit code. Faults can be injected per request or at a rate
//! ([`crate::chaos`]), RBAC can refuse a verb on a resource, a namespace can be missing; every request is
//! recorded in RBAC terms (verb, resource, namespace) so tests can compare it with deploy/.
//!
//! Like kubelet, it can project a Secret into a directory (one file per key), so that a login
//! pod's exec (which runs here) finds the keys the service wrote. Everything a test does through
//! the methods of [`FakeK8s`] it can also do from another process through `/_fake/…` (see
//! [`control`]).

pub mod control;
mod exec;
pub mod operator;
mod rest;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::Method;
use axum::routing::get;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::net::TcpListener;

#[derive(Clone, Debug)]
pub enum Fault {
    /// Answer with this code and a Status body (and Retry-After for 429).
    Status(u16, Option<u32>),
    /// Answer only after this long.
    Delay(Duration),
    /// Exec: send the first output, then drop the connection without a status.
    DropExec,
}

/// One request, in RBAC terms.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Access {
    pub verb: String,
    /// `secrets`, `deployments.apps`, `pods/exec`, …
    pub resource: String,
    pub namespace: Option<String>,
}

/// One exec that ran: where, what, and how it ended (`None`: it did not end with a status).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Exec {
    pub namespace: String,
    pub pod: String,
    pub argv: Vec<String>,
    pub code: Option<i32>,
}

/// A Secret that kubelet projects into a directory: each key of its `data` a file there.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Projection {
    pub namespace: String,
    pub secret: String,
    pub dir: PathBuf,
}

#[derive(Default)]
pub(crate) struct Inner {
    objects: BTreeMap<String, Value>,
    /// (object URL, field manager) → the leaf paths it applied last.
    managed: BTreeMap<(String, String), BTreeSet<Vec<String>>>,
    faults: VecDeque<(Method, String, Fault)>,
    log: Vec<(Method, String, Access)>,
    version: u64,
    protocols: Vec<&'static str>,
    patches: Vec<(String, String, Value)>,
    execs: Vec<Exec>,
    /// Each projection with the files it wrote (several may share a directory).
    projections: Vec<(Projection, BTreeSet<String>)>,
    /// The garbage collector of deleted objects' dependents (see [`operator`]).
    operator: operator::Operator,
    /// Rate-based faults (see [`crate::chaos`]).
    chaos: crate::chaos::Chaos,
    /// Requests RBAC refuses (403), as a Role lacking them would.
    forbidden: BTreeSet<Access>,
    /// Namespaces that do not exist (deleted): nothing can be created in them.
    absent_namespaces: BTreeSet<String>,
}

pub(crate) type Shared = Arc<Mutex<Inner>>;

impl Inner {
    /// Stores (or with `None` removes) an object, as every write does: a new resourceVersion,
    /// and the projections of a Secret brought up to date.
    fn store(&mut self, url: &str, obj: Option<Value>) -> Option<Value> {
        let old = match obj {
            Some(mut obj) => {
                self.version += 1;
                obj["metadata"]["resourceVersion"] = json!(self.version.to_string());
                self.objects.insert(url.into(), obj)
            }
            None => self.objects.remove(url),
        };
        self.project(url);
        old
    }

    fn project(&mut self, url: &str) {
        for (p, written) in &mut self.projections {
            if url == p.secret_url() {
                *written = project(p, self.objects.get(url), written);
            }
        }
    }
}

impl Projection {
    fn secret_url(&self) -> String {
        format!("/api/v1/namespaces/{}/secrets/{}", self.namespace, self.secret)
    }
}

/// Writes the Secret's keys as files of the projection's directory (each replaced by a rename,
/// as kubelet swaps its `..data` link) and removes the files it wrote for keys the Secret no
/// longer has; returns the files it has now.
fn project(p: &Projection, secret: Option<&Value>, written: &BTreeSet<String>) -> BTreeSet<String> {
    use base64::Engine as _;
    let _ = std::fs::create_dir_all(&p.dir);
    let data = secret.and_then(|s| s["data"].as_object()).cloned().unwrap_or_default();
    for (key, value) in &data {
        let bytes = base64::engine::general_purpose::STANDARD.decode(value.as_str().unwrap_or("")).unwrap_or_default();
        let tmp = p.dir.join(format!("..{key}.tmp"));
        if std::fs::write(&tmp, bytes).is_ok() {
            let _ = std::fs::rename(&tmp, p.dir.join(key));
        }
    }
    for gone in written.iter().filter(|k| !data.contains_key(*k)) {
        let _ = std::fs::remove_file(p.dir.join(gone));
    }
    data.keys().cloned().collect()
}

#[derive(Clone)]
pub struct FakeK8s {
    inner: Shared,
    pub url: String,
}

impl FakeK8s {
    /// Serves on a free port of 127.0.0.1, in this process.
    pub async fn start() -> Self {
        Self::serve(TcpListener::bind("127.0.0.1:0").await.unwrap())
    }

    /// Serves on `listener` (with the control API under `/_fake/`) until the runtime ends.
    pub fn serve(listener: TcpListener) -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            protocols: vec!["v5.channel.k8s.io", "v4.channel.k8s.io"],
            ..Default::default()
        }));
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods/{pod}/exec", get(exec::exec))
            .nest("/_fake", control::router())
            .fallback(rest::rest)
            .with_state(inner.clone());
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { inner, url: format!("http://{addr}") }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    /// Stores an object at its URL (e.g. `/api/v1/namespaces/t/secrets/x`).
    pub fn put(&self, url: &str, obj: Value) {
        self.lock().store(url, Some(obj));
    }

    pub fn get(&self, url: &str) -> Option<Value> {
        self.lock().objects.get(url).cloned()
    }

    /// The objects whose URL starts with `prefix`, by URL.
    pub fn objects(&self, prefix: &str) -> BTreeMap<String, Value> {
        self.lock().objects.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(k, v)| (k.clone(), v.clone())).collect()
    }

    /// A Pod that is Running and Ready (or not), with labels.
    pub fn pod(&self, ns: &str, name: &str, labels: Value, ready: bool) {
        self.put(&format!("/api/v1/namespaces/{ns}/pods/{name}"), pod(ns, name, labels, ready));
    }

    pub fn deployment(&self, ns: &str, name: &str, labels: Value) {
        self.put(&format!("/apis/apps/v1/namespaces/{ns}/deployments/{name}"), deployment(ns, name, labels));
    }

    /// The next request whose method matches and whose path contains `path` gets `fault`.
    pub fn fault(&self, method: Method, path: &str, fault: Fault) {
        self.lock().faults.push_back((method, path.into(), fault));
    }

    /// From now on a share of the API requests fail (`None`: none).
    pub fn chaos(&self, spec: Option<crate::chaos::ChaosSpec>) {
        self.lock().chaos.set(spec);
    }

    pub fn chaos_report(&self) -> crate::chaos::ChaosReport {
        self.lock().chaos.report()
    }

    /// From now on RBAC refuses `access` (403 naming it, as the real API server words it).
    pub fn forbid(&self, access: Access) {
        self.lock().forbidden.insert(access);
    }

    /// Deletes namespace `ns` with everything in it; creating anything there then fails with
    /// 404 `namespaces "<ns>" not found`, as on a real API server.
    pub fn delete_namespace(&self, ns: &str) {
        let mut g = self.lock();
        // its objects of every API group, and the Namespace object itself if there is one
        let (inside, itself) = (format!("/namespaces/{ns}/"), format!("/api/v1/namespaces/{ns}"));
        let inside: Vec<String> = g.objects.keys().filter(|k| k.contains(&inside) || **k == itself).cloned().collect();
        for k in inside {
            g.store(&k, None);
        }
        g.absent_namespaces.insert(ns.to_string());
    }

    /// Which exec subprotocols the server accepts, in its order of preference.
    pub fn protocols(&self, p: Vec<&'static str>) {
        self.lock().protocols = p;
    }

    /// How the operator collects a deleted object's dependents (stuck: never).
    pub fn operator(&self, op: operator::Operator) {
        self.lock().operator = op;
    }

    /// Projects Secret `namespace/secret` into `dir` from now on, as kubelet would.
    pub fn project(&self, p: Projection) {
        let mut g = self.lock();
        let written = project(&p, g.objects.get(&p.secret_url()), &BTreeSet::new());
        g.projections.push((p, written));
    }

    pub fn accesses(&self) -> BTreeSet<Access> {
        self.lock().log.iter().map(|(_, _, a)| a.clone()).collect()
    }

    pub fn requests(&self) -> Vec<(Method, String)> {
        self.lock().log.iter().map(|(m, p, _)| (m.clone(), p.clone())).collect()
    }

    /// (content type, path, body) of each PATCH.
    pub fn patches(&self) -> Vec<(String, String, Value)> {
        self.lock().patches.clone()
    }

    /// Every exec, in the order they ended.
    pub fn execs(&self) -> Vec<Exec> {
        self.lock().execs.clone()
    }
}

/// A Pod object: Running, Ready or not.
pub fn pod(ns: &str, name: &str, labels: Value, ready: bool) -> Value {
    let cond = if ready { "True" } else { "False" };
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
           "spec": {"containers": [{"name": "main"}]},
           "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": cond}]}})
}

/// A Deployment object selecting `labels`.
pub fn deployment(ns: &str, name: &str, labels: Value) -> Value {
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
           "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "main"}]}}}})
}

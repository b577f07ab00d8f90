//! A fake Kubernetes API server that the real `kube` client talks to over HTTP: objects kept as
//! JSON by URL, GET/list (label selectors), server-side apply, merge patch, DELETE, `Status`
//! bodies for errors, and exec over WebSocket (v4/v5) running the argv as a local process and
//! streaming its real output and exit code. Faults can be injected per request; every request is
//! recorded in RBAC terms (verb, resource, namespace) so tests can compare it with deploy/.

mod exec;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

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
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Access {
    pub verb: String,
    /// `secrets`, `deployments.apps`, `pods/exec`, …
    pub resource: String,
    pub namespace: Option<String>,
}

#[derive(Default)]
struct Inner {
    objects: BTreeMap<String, Value>,
    /// (object URL, field manager) → the leaf paths it applied last.
    managed: BTreeMap<(String, String), BTreeSet<Vec<String>>>,
    faults: VecDeque<(Method, String, Fault)>,
    log: Vec<(Method, String, Access)>,
    version: u64,
    protocols: Vec<&'static str>,
    patches: Vec<(String, String, Value)>,
}

#[derive(Clone)]
pub struct FakeK8s {
    inner: Arc<Mutex<Inner>>,
    pub url: String,
}

fn status(code: u16, reason: &str, message: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response()
}

/// Where a URL points: the object's storage key, its RBAC resource and namespace, and whether
/// it names one object (vs. a collection).
struct Target {
    key: String,
    collection: String,
    access: (String, Option<String>),
    named: bool,
}

fn target(path: &str) -> Option<Target> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, rest) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => (String::new(), rest),
        ["apis", g, _v, rest @ ..] => ((*g).to_string(), rest),
        _ => return None,
    };
    let (ns, res, name) = match rest {
        ["namespaces", ns, res, name] => (Some(*ns), *res, Some(*name)),
        ["namespaces", ns, res] => (Some(*ns), *res, None),
        [res, name] => (None, *res, Some(*name)),
        [res] => (None, *res, None),
        _ => return None,
    };
    let prefix = &path[..path.len() - name.map_or(0, |n| n.len() + 1)];
    let resource = if group.is_empty() { res.to_string() } else { format!("{res}.{group}") };
    Some(Target {
        key: path.trim_end_matches('/').to_string(),
        collection: prefix.trim_end_matches('/').to_string(),
        access: (resource, ns.map(Into::into)),
        named: name.is_some(),
    })
}

fn leaves(v: &Value, at: Vec<String>, out: &mut BTreeSet<Vec<String>>) {
    match v.as_object() {
        Some(m) if !m.is_empty() => m.iter().for_each(|(k, v)| {
            let mut p = at.clone();
            p.push(k.clone());
            leaves(v, p, out)
        }),
        _ => {
            out.insert(at);
        }
    }
}

fn merge(dst: &mut Value, patch: &Value) {
    match (dst.as_object_mut(), patch.as_object()) {
        (Some(d), Some(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    d.remove(k);
                } else {
                    merge(d.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        _ => *dst = patch.clone(),
    }
}

fn remove_path(v: &mut Value, path: &[String]) {
    match path {
        [] => {}
        [last] => {
            v.as_object_mut().map(|m| m.remove(last));
        }
        [first, rest @ ..] => {
            if let Some(child) = v.get_mut(first) {
                remove_path(child, rest)
            }
        }
    }
}

fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect()
}

fn selected(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

impl FakeK8s {
    pub async fn start() -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            protocols: vec!["v5.channel.k8s.io", "v4.channel.k8s.io"],
            ..Default::default()
        }));
        let app = Router::new()
            .route("/api/v1/namespaces/{ns}/pods/{pod}/exec", get(exec::exec))
            .fallback(rest)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr: SocketAddr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { inner, url: format!("http://{addr}") }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    /// Stores an object at its URL (e.g. `/api/v1/namespaces/t/secrets/x`).
    pub fn put(&self, url: &str, obj: Value) {
        let mut g = self.lock();
        g.version += 1;
        let mut obj = obj;
        obj["metadata"]["resourceVersion"] = json!(g.version.to_string());
        g.objects.insert(url.into(), obj);
    }

    pub fn get(&self, url: &str) -> Option<Value> {
        self.lock().objects.get(url).cloned()
    }

    /// A Pod that is Running and Ready (or not), with labels.
    pub fn pod(&self, ns: &str, name: &str, labels: Value, ready: bool) {
        let cond = if ready { "True" } else { "False" };
        self.put(
            &format!("/api/v1/namespaces/{ns}/pods/{name}"),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": labels},
                   "spec": {"containers": [{"name": "main"}]},
                   "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": cond}]}}),
        );
    }

    pub fn deployment(&self, ns: &str, name: &str, labels: Value) {
        self.put(
            &format!("/apis/apps/v1/namespaces/{ns}/deployments/{name}"),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": ns},
                   "spec": {"selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "main"}]}}}}),
        );
    }

    /// The next request whose method matches and whose path contains `path` gets `fault`.
    pub fn fault(&self, method: Method, path: &str, fault: Fault) {
        self.lock().faults.push_back((method, path.into(), fault));
    }

    /// Which exec subprotocols the server accepts, in its order of preference.
    pub fn protocols(&self, p: Vec<&'static str>) {
        self.lock().protocols = p;
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
}

fn take_fault(inner: &Mutex<Inner>, method: &Method, path: &str) -> Option<Fault> {
    let mut g = inner.lock().unwrap();
    let i = g.faults.iter().position(|(m, p, _)| m == method && path.contains(p.as_str()))?;
    g.faults.remove(i).map(|(_, _, f)| f)
}

async fn apply_fault(f: Option<Fault>) -> Option<Response> {
    match f {
        Some(Fault::Status(429, after)) => {
            let secs = after.unwrap_or(1);
            let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
                "details": {"retryAfterSeconds": secs}, "code": 429});
            Some((StatusCode::TOO_MANY_REQUESTS, [("retry-after", secs.to_string())], axum::Json(body)).into_response())
        }
        Some(Fault::Status(403, _)) => {
            Some(status(403, "Forbidden", "User \"system:serviceaccount:onramp:onramp\" cannot do this"))
        }
        Some(Fault::Status(code, _)) => Some(status(code, "InternalError", "Internal error occurred: injected")),
        Some(Fault::Delay(d)) => {
            tokio::time::sleep(d).await;
            None
        }
        _ => None,
    }
}

async fn rest(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path = uri.path().to_string();
    let Some(t) = target(&path) else {
        return status(404, "NotFound", "the server could not find the requested resource");
    };
    let verb = match (&method, t.named) {
        (&Method::GET, true) => "get",
        (&Method::GET, false) => "list",
        (&Method::PATCH, _) => "patch",
        (&Method::DELETE, _) => "delete",
        (&Method::POST, _) => "create",
        (&Method::PUT, _) => "update",
        _ => "unknown",
    };
    let access = Access { verb: verb.into(), resource: t.access.0.clone(), namespace: t.access.1.clone() };
    inner.lock().unwrap().log.push((method.clone(), uri.to_string(), access));
    if let Some(r) = apply_fault(take_fault(&inner, &method, &path)).await {
        return r;
    }
    let q = query_pairs(&uri);
    let mut g = inner.lock().unwrap();
    let not_found =
        || status(404, "NotFound", &format!("{} \"{}\" not found", t.access.0, path.rsplit('/').next().unwrap()));
    match (verb, t.named) {
        ("get", _) => g.objects.get(&t.key).map(|o| axum::Json(o.clone()).into_response()).unwrap_or_else(not_found),
        ("list", _) => {
            let sel = q.iter().find(|(k, _)| k == "labelSelector").map(|(_, v)| v.clone()).unwrap_or_default();
            let items: Vec<Value> = g
                .objects
                .iter()
                .filter(|(k, o)| k.rsplit_once('/').map(|(c, _)| c) == Some(t.collection.as_str()) && selected(o, &sel))
                .map(|(_, o)| o.clone())
                .collect();
            axum::Json(json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": g.version.to_string()}, "items": items}))
                .into_response()
        }
        ("delete", true) => match g.objects.remove(&t.key) {
            Some(_) => axum::Json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}))
                .into_response(),
            None => not_found(),
        },
        ("patch", true) => {
            let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            let Ok(patch) = serde_json::from_slice::<Value>(&body) else {
                return status(400, "BadRequest", "body is not JSON");
            };
            g.patches.push((ct.clone(), path.clone(), patch.clone()));
            let existing = g.objects.get(&t.key).cloned();
            let obj = if ct.starts_with("application/apply-patch+yaml") {
                let Some(manager) = q.iter().find(|(k, _)| k == "fieldManager").map(|(_, v)| v.clone()) else {
                    return status(400, "BadRequest", "fieldManager is required for apply");
                };
                let wanted_rv = patch["metadata"]["resourceVersion"].as_str().map(String::from);
                let mut obj = match (&existing, &wanted_rv) {
                    (None, Some(_)) => return not_found(),
                    (Some(o), Some(rv)) if o["metadata"]["resourceVersion"].as_str() != Some(rv) => {
                        return status(
                            409,
                            "Conflict",
                            "the object has been modified; please apply your changes to the latest version and try again",
                        );
                    }
                    (Some(o), _) => o.clone(),
                    (None, None) => {
                        // Like the real API server: an apply that creates also needs `create`.
                        let access = Access {
                            verb: "create".into(),
                            resource: t.access.0.clone(),
                            namespace: t.access.1.clone(),
                        };
                        g.log.push((method.clone(), uri.to_string(), access));
                        json!({})
                    }
                };
                let mut applied = BTreeSet::new();
                let mut body = patch.clone();
                remove_path(&mut body, &["metadata".into(), "resourceVersion".into()]);
                leaves(&body, vec![], &mut applied);
                let before = g.managed.get(&(t.key.clone(), manager.clone())).cloned().unwrap_or_default();
                for gone in before.difference(&applied) {
                    remove_path(&mut obj, gone);
                }
                merge(&mut obj, &body);
                g.managed.insert((t.key.clone(), manager), applied);
                obj
            } else if ct.starts_with("application/merge-patch+json") {
                let Some(mut obj) = existing else {
                    return not_found();
                };
                merge(&mut obj, &patch);
                obj
            } else {
                return status(
                    415,
                    "UnsupportedMediaType",
                    &format!("the body of the request was in an unknown format: {ct}"),
                );
            };
            g.version += 1;
            let mut obj = obj;
            obj["metadata"]["resourceVersion"] = json!(g.version.to_string());
            g.objects.insert(t.key.clone(), obj.clone());
            axum::Json(obj).into_response()
        }
        _ => status(405, "MethodNotAllowed", "the server does not allow this method on the requested resource"),
    }
}

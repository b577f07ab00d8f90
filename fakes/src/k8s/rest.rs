//! The REST side of the fake API server: objects by URL, list with label selectors, server-side
//! apply (with field managers and resourceVersion conflicts), merge patch, DELETE, and injected
//! faults, each request logged in RBAC terms.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{Access, Fault, Inner};
use crate::chaos::Decision;

pub(super) fn status(code: u16, reason: &str, message: &str) -> Response {
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

pub(super) fn query_pairs(uri: &Uri) -> Vec<(String, String)> {
    form_urlencoded::parse(uri.query().unwrap_or("").as_bytes()).into_owned().collect()
}

fn selected(obj: &Value, selector: &str) -> bool {
    selector.split(',').filter(|s| !s.is_empty()).all(|term| {
        let (k, v) = term.split_once('=').unwrap_or((term, ""));
        obj["metadata"]["labels"][k].as_str() == Some(v)
    })
}

/// The request's fault: a one-shot one aimed at it, else maybe one of the chaos.
pub(super) fn take_fault(inner: &Mutex<Inner>, method: &Method, path: &str) -> Option<Fault> {
    let mut g = inner.lock().unwrap();
    if let Some(i) = g.faults.iter().position(|(m, p, _)| m == method && path.contains(p.as_str())) {
        return g.faults.remove(i).map(|(_, _, f)| f);
    }
    let exec = path.split('?').next().is_some_and(|p| p.ends_with("/exec"));
    Some(match g.chaos.decide(method.as_str(), path, exec)? {
        Decision::Status { code, retry_after } => Fault::Status(code, retry_after),
        Decision::Delay(d) => Fault::Delay(d),
        Decision::DropExec => Fault::DropExec,
    })
}

/// RBAC's refusal of `access`, worded as the real API server words it.
pub(super) fn forbidden(inner: &Mutex<Inner>, access: &Access, name: Option<&str>) -> Option<Response> {
    if !inner.lock().unwrap().forbidden.contains(access) {
        return None;
    }
    let (resource, group) = access.resource.split_once('.').unwrap_or((access.resource.as_str(), ""));
    let what = match name {
        Some(n) => format!("{} \"{n}\" is forbidden", access.resource),
        None => format!("{} is forbidden", access.resource),
    };
    let scope = match &access.namespace {
        Some(ns) => format!(" in the namespace \"{ns}\""),
        None => " at the cluster scope".into(),
    };
    let message = format!(
        "{what}: User \"system:serviceaccount:onramp:onramp\" cannot {} resource \"{resource}\" in API group \"{group}\"{scope}",
        access.verb
    );
    Some(status(403, "Forbidden", &message))
}

pub(super) async fn apply_fault(f: Option<Fault>) -> Option<Response> {
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

pub(super) async fn rest(
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
    inner.lock().unwrap().log.push((method.clone(), uri.to_string(), access.clone()));
    if let Some(r) = apply_fault(take_fault(&inner, &method, &path)).await {
        return r;
    }
    if let Some(r) = forbidden(&inner, &access, t.named.then(|| path.rsplit('/').next().unwrap_or(""))) {
        return r;
    }
    let absent = t.access.1.as_ref().filter(|ns| inner.lock().unwrap().absent_namespaces.contains(*ns)).cloned();
    let creates = verb == "create" || (verb == "patch" && !inner.lock().unwrap().objects.contains_key(&t.key));
    if let Some(ns) = absent.filter(|_| creates) {
        return status(404, "NotFound", &format!("namespaces \"{ns}\" not found"));
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
            let rv = g.version.to_string();
            // `Accept: …;as=PartialObjectMetadataList;…`: metadata only, as the real server answers
            let accept = headers.get("accept").and_then(|v| v.to_str().ok()).unwrap_or("");
            if accept.contains("as=PartialObjectMetadataList") {
                let meta = "meta.k8s.io/v1";
                let items: Vec<Value> = items
                    .iter()
                    .map(|o| json!({"apiVersion": meta, "kind": "PartialObjectMetadata", "metadata": o["metadata"]}))
                    .collect();
                let list = json!({"kind": "PartialObjectMetadataList", "apiVersion": meta, "metadata": {"resourceVersion": rv}, "items": items});
                return axum::Json(list).into_response();
            }
            axum::Json(json!({"kind": "List", "apiVersion": "v1", "metadata": {"resourceVersion": rv}, "items": items}))
                .into_response()
        }
        ("delete", true) => match g.store(&t.key, None) {
            Some(obj) => {
                drop(g);
                super::operator::deleted(&inner, &t.key, &obj);
                axum::Json(json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success"}))
                    .into_response()
            }
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
            g.store(&t.key, Some(obj));
            axum::Json(g.objects[&t.key].clone()).into_response()
        }
        ("create", false) => {
            let Ok(obj) = serde_json::from_slice::<Value>(&body) else {
                return status(400, "BadRequest", "body is not JSON");
            };
            let Some(name) = obj["metadata"]["name"].as_str().map(String::from) else {
                return status(422, "Invalid", "metadata.name: Required value: name is required");
            };
            let key = format!("{}/{name}", t.key);
            if g.objects.contains_key(&key) {
                return status(409, "AlreadyExists", &format!("{} \"{name}\" already exists", t.access.0));
            }
            g.store(&key, Some(obj));
            (StatusCode::CREATED, axum::Json(g.objects[&key].clone())).into_response()
        }
        _ => status(405, "MethodNotAllowed", "the server does not allow this method on the requested resource"),
    }
}

//! The operator and garbage collector, as far as a tenant's clean-up needs them: when an object
//! is deleted, the objects whose `ownerReferences` name it (same namespace; by uid when both
//! have one, else by kind and name) are deleted some time later — the real garbage collector is
//! asynchronous — and their own dependents with them. The operator can be made "stuck": then
//! nothing is collected (what a broken operator or a finalizer that never clears leaves behind).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::Shared;

/// How the fake operator behaves (control API: `POST /_fake/operator`).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Operator {
    /// Keep dependents of deleted objects (never collect them).
    #[serde(default)]
    pub stuck: bool,
    /// How long after a delete its dependents go.
    #[serde(default = "default_delay")]
    pub gc_delay_ms: u64,
}

fn default_delay() -> u64 {
    300
}

impl Default for Operator {
    fn default() -> Self {
        Self { stuck: false, gc_delay_ms: default_delay() }
    }
}

/// The namespace part of an object URL (`…/namespaces/<ns>/…`).
fn namespace(url: &str) -> Option<&str> {
    let mut segs = url.split('/');
    segs.by_ref().find(|s| *s == "namespaces")?;
    segs.next()
}

fn owned_by(obj: &Value, kind: &str, name: &str, uid: Option<&str>) -> bool {
    obj["metadata"]["ownerReferences"].as_array().is_some_and(|refs| {
        refs.iter().any(|r| {
            r["kind"].as_str() == Some(kind)
                && r["name"].as_str() == Some(name)
                && match (r["uid"].as_str(), uid) {
                    (Some(a), Some(b)) => a == b,
                    _ => true,
                }
        })
    })
}

/// Called after `url` was deleted (it held `obj`): collects its dependents later, unless stuck.
pub(super) fn deleted(inner: &Shared, url: &str, obj: &Value) {
    let (Some(ns), Some(kind), Some(name)) = (namespace(url), obj["kind"].as_str(), obj["metadata"]["name"].as_str())
    else {
        return;
    };
    let op = inner.lock().unwrap().operator.clone();
    if op.stuck {
        return;
    }
    let (inner, ns) = (inner.clone(), ns.to_string());
    let owner = (kind.to_string(), name.to_string(), obj["metadata"]["uid"].as_str().map(String::from));
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(op.gc_delay_ms)).await;
        let mut g = inner.lock().unwrap();
        if g.operator.stuck {
            return;
        }
        let mut owners = vec![owner];
        while let Some((kind, name, uid)) = owners.pop() {
            let doomed: Vec<(String, Value)> = g
                .objects
                .iter()
                .filter(|(u, o)| namespace(u) == Some(ns.as_str()) && owned_by(o, &kind, &name, uid.as_deref()))
                .map(|(u, o)| (u.clone(), o.clone()))
                .collect();
            for (url, o) in doomed {
                g.store(&url, None);
                let meta = &o["metadata"];
                if let (Some(k), Some(n)) = (o["kind"].as_str(), meta["name"].as_str()) {
                    owners.push((k.to_string(), n.to_string(), meta["uid"].as_str().map(String::from)));
                }
            }
        }
    });
}

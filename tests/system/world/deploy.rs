//! How deploy/ starts onramp, read from its manifests: each container's `args` and `env` (plain
//! values, and `fieldRef: metadata.name` as the pod's name). The world starts its processes with
//! exactly these, plus what the Secret `onramp` would hold (`envFrom`) and the paths of the files
//! it mounts.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// One container of a manifest: its command line and environment.
#[derive(Clone, Debug)]
pub struct Container {
    pub args: Vec<String>,
    /// Env entries by name: `Some(value)`, or `None` for a `fieldRef` to `metadata.name`.
    pub env: BTreeMap<String, Option<String>>,
    /// Whether it takes the Secret `onramp` as its environment.
    pub secret_env: bool,
}

impl Container {
    /// The environment of the container in pod `pod`.
    pub fn env_in(&self, pod: &str) -> BTreeMap<String, String> {
        self.env.iter().map(|(k, v)| (k.clone(), v.clone().unwrap_or_else(|| pod.to_string()))).collect()
    }
}

/// The first container of the workload `kind`/`name` in `deploy/<file>`.
pub fn container(file: &str, kind: &str, name: &str) -> Container {
    let path = format!("{}/deploy/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{path} has no {kind} {name}"));
    let c = &doc["spec"]["template"]["spec"]["containers"][0];
    let args = c["args"].as_array().map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect());
    let mut env = BTreeMap::new();
    for e in c["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("env name").to_string();
        let value = match (&e["value"], &e["valueFrom"]["fieldRef"]["fieldPath"]) {
            (Value::String(v), _) => Some(v.clone()),
            (Value::Number(n), _) => Some(n.to_string()),
            (Value::Bool(b), _) => Some(b.to_string()),
            (_, Value::String(f)) if f == "metadata.name" => None,
            other => panic!("{path}: env {name}: {other:?} is not something the world can give"),
        };
        env.insert(name, value);
    }
    let secret_env = c["envFrom"].as_array().into_iter().flatten().any(|e| e["secretRef"]["name"] == "onramp");
    Container { args: args.unwrap_or_default(), env, secret_env }
}

pub fn api() -> Container {
    container("api.yaml", "Deployment", "onramp-api")
}

pub fn worker() -> Container {
    container("worker.yaml", "Deployment", "onramp-worker")
}

pub fn migrate() -> Container {
    container("migrate-job.yaml", "Job", "onramp-migrate")
}

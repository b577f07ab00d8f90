//! How deploy/base starts onramp, read from its manifests: each container's `args`, `env` (plain
//! values, and `fieldRef: metadata.name` as the pod's name), the ConfigMap `onramp-settings` it
//! takes as environment (the kustomization's literals), and its volume mounts: the tenant
//! registry ConfigMap and the items of the Secret `onramp` it mounts as files. The world gives
//! each process exactly these, with the mount paths moved into the world's directory.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

/// What a mounted volume is.
#[derive(Clone, Debug, PartialEq)]
pub enum Volume {
    /// A ConfigMap, by name (the registry).
    ConfigMap(String),
    /// Items (key, file name) of the Secret `onramp`.
    Secret(Vec<(String, String)>),
    /// Scratch space (`/tmp`).
    EmptyDir,
}

/// One container of a manifest: its command line, environment and mounts.
#[derive(Clone, Debug)]
pub struct Container {
    pub args: Vec<String>,
    /// Env entries by name: `Some(value)`, or `None` for a `fieldRef` to `metadata.name`.
    pub env: BTreeMap<String, Option<String>>,
    /// Whether it takes the ConfigMap `onramp-settings` as its environment.
    pub settings_env: bool,
    /// (mount path, volume).
    pub mounts: Vec<(String, Volume)>,
}

impl Container {
    /// The environment of the container in pod `pod`, each path under a mount moved to where
    /// `local(volume)` put that volume's files.
    pub fn env_in(&self, pod: &str, local: impl Fn(&Volume) -> Option<String>) -> BTreeMap<String, String> {
        let moved = |v: String| {
            for (path, vol) in &self.mounts {
                if let (Some(rest), Some(dir)) = (v.strip_prefix(&format!("{path}/")), local(vol)) {
                    return format!("{dir}/{rest}");
                }
            }
            v
        };
        self.env.iter().map(|(k, v)| (k.clone(), moved(v.clone().unwrap_or_else(|| pod.to_string())))).collect()
    }
}

fn base(file: &str) -> String {
    format!("{}/deploy/base/{file}", env!("CARGO_MANIFEST_DIR"))
}

/// The literals of the ConfigMap `onramp-settings` in deploy/base/kustomization.yaml.
pub fn settings_literals() -> BTreeMap<String, String> {
    let path = base("kustomization.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let k: Value = serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    let generator = k["configMapGenerator"].as_array().into_iter().flatten().find(|g| g["name"] == "onramp-settings");
    let generator = generator.unwrap_or_else(|| panic!("{path} generates no ConfigMap onramp-settings"));
    generator["literals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            let (k, v) = l.as_str().and_then(|l| l.split_once('=')).expect("NAME=value literal");
            (k.to_string(), v.to_string())
        })
        .collect()
}

fn volume(path: &Path, spec: &Value, name: &str) -> Volume {
    let v = spec["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == name);
    let v = v.unwrap_or_else(|| panic!("{}: no volume {name}", path.display()));
    if let Some(cm) = v["configMap"]["name"].as_str() {
        Volume::ConfigMap(cm.into())
    } else if v["secret"]["secretName"] == "onramp" {
        let items = v["secret"]["items"].as_array().into_iter().flatten();
        Volume::Secret(items.map(|i| (i["key"].as_str().unwrap().into(), i["path"].as_str().unwrap().into())).collect())
    } else if v.get("emptyDir").is_some() {
        Volume::EmptyDir
    } else {
        panic!("{}: volume {name} is not something the world can give: {v}", path.display())
    }
}

/// The first container of the workload `kind`/`name` in `deploy/base/<file>`.
pub fn container(file: &str, kind: &str, name: &str) -> Container {
    let path = base(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let doc = serde_yaml_ng::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap_or_else(|e| panic!("{path}: {e}")))
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{path} has no {kind} {name}"));
    let spec = &doc["spec"]["template"]["spec"];
    let c = &spec["containers"][0];
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
    let settings_env =
        c["envFrom"].as_array().into_iter().flatten().any(|e| e["configMapRef"]["name"] == "onramp-settings");
    let mounts = c["volumeMounts"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let name = m["name"].as_str().unwrap();
            (m["mountPath"].as_str().unwrap().to_string(), volume(Path::new(&path), spec, name))
        })
        .collect();
    Container { args: args.unwrap_or_default(), env, settings_env, mounts }
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

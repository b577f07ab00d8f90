//! deploy/rbac.yaml grants exactly what the code uses: every operation runs once against the
//! fake API server, which records each request in RBAC terms (including `create` for an apply
//! that creates, and both `get` and `create` for a WebSocket exec, as real API servers check);
//! every request must be granted in its scope, and every granted rule must have been used.
//! Only the worker's service account is bound; the API's has no rights and no token. And the
//! tenant registry that deploy/base mounts loads.

use std::collections::BTreeSet;
use std::time::Duration;

use onramp::backends::exec::Command;
use onramp::backends::kubernetes::Kubernetes;
use onramp::domain::names::Username;
use onramp::domain::sshkey::PublicKey;
use serde_json::{Value, json};

use crate::k8s_support::{TENANT, client, cluster, tenant};
use onramp_fakes::k8s::Access;

/// (role name, verb, resource) for every rule, reading the one-line rules of deploy/rbac.yaml.
fn granted() -> BTreeSet<(String, String, String)> {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/rbac.yaml")).unwrap();
    let mut out = BTreeSet::new();
    for doc in text.split("\n---\n") {
        let kind = doc.lines().find_map(|l| l.strip_prefix("kind: ")).unwrap_or("");
        if kind != "Role" && kind != "ClusterRole" {
            continue;
        }
        let name = doc.lines().find_map(|l| l.trim().strip_prefix("name: ")).unwrap().to_string();
        for line in doc.lines().filter_map(|l| l.trim().strip_prefix("- {apiGroups:")) {
            let json = format!("{{\"apiGroups\":{line}")
                .replace(" resources:", " \"resources\":")
                .replace(" verbs:", " \"verbs\":");
            let rule: Value = serde_json::from_str(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
            for g in rule["apiGroups"].as_array().unwrap() {
                for r in rule["resources"].as_array().unwrap() {
                    for v in rule["verbs"].as_array().unwrap() {
                        let (g, r) = (g.as_str().unwrap(), r.as_str().unwrap());
                        let res = if g.is_empty() { r.to_string() } else { format!("{r}.{g}") };
                        out.insert((name.clone(), v.as_str().unwrap().to_string(), res));
                    }
                }
            }
        }
    }
    out
}

fn role_for(a: &Access) -> &'static str {
    match a.namespace.as_deref() {
        None => "onramp-nodes",
        Some("slurm-control") => "onramp-slurm",
        Some(_) => "onramp-tenant",
    }
}

#[tokio::test]
async fn rbac_grants_exactly_what_the_code_uses() {
    let (fake, _) = cluster().await;
    let k8s = client(&fake, |s| s.manage_keys = true);
    // Through the trait object flows hold.
    let k8s: std::sync::Arc<dyn Kubernetes> = std::sync::Arc::new(k8s);
    let t = tenant();
    let u = Username::parse("alice").unwrap();
    let key =
        PublicKey::parse("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl a").unwrap();
    let t30 = Duration::from_secs(30);

    k8s.key_state(&t, &u, &key).await.unwrap();
    k8s.put_key(&t, &u, &key).await.unwrap();
    k8s.remove_key(&t, &u).await.unwrap();
    k8s.slurmctld().run(&Command::new("true"), t30).await.unwrap();
    k8s.login(&t).run(&Command::new("true"), t30).await.unwrap();
    // a tenant whose login pod is a Ready pod of its login Deployment
    let by_deployment = onramp::domain::tenants::K8sNames { login_pod: None, ..t.clone() };
    k8s.login(&by_deployment).run(&Command::new("true"), t30).await.unwrap();
    k8s.restart_login(&t).await.unwrap();
    k8s.apply_network_policy(&t).await.unwrap();
    k8s.read_network_policy(&t).await.unwrap();
    fake.put("/api/v1/nodes/gpu-1", json!({"metadata": {"name": "gpu-1", "labels": {"reserved.tenant": TENANT}}}));
    k8s.remove_node_labels(&t).await.unwrap();
    k8s.delete_slurm_cluster(&t).await.unwrap();
    k8s.cluster_leftovers(&t).await.unwrap();
    k8s.delete_reservation(&t).await.unwrap();

    let granted = granted();
    let used: BTreeSet<(String, String, String)> =
        fake.accesses().iter().map(|a| (role_for(a).to_string(), a.verb.clone(), a.resource.clone())).collect();
    let missing: Vec<_> = used.difference(&granted).collect();
    let unused: Vec<_> = granted.difference(&used).collect();
    assert!(missing.is_empty(), "calls not granted by deploy/rbac.yaml: {missing:?}");
    assert!(unused.is_empty(), "rules in deploy/rbac.yaml that no call uses: {unused:?}");
}

fn deploy_file(path: &str) -> String {
    std::fs::read_to_string(format!("{}/deploy/{path}", env!("CARGO_MANIFEST_DIR"))).unwrap()
}

#[test]
fn only_the_workers_service_account_is_bound() {
    const WORKER: &str = "- {kind: ServiceAccount, name: onramp-worker, namespace: onramp}";
    for f in ["rbac.yaml", "examples/tenant-foo/rolebinding.yaml"] {
        let text = deploy_file(f);
        let subjects: Vec<&str> = text.lines().map(str::trim).filter(|l| l.starts_with("- {kind:")).collect();
        assert!(!subjects.is_empty(), "deploy/{f} binds nothing");
        assert!(subjects.iter().all(|s| *s == WORKER), "deploy/{f} binds more than the worker: {subjects:?}");
        assert!(!text.lines().any(|l| l.trim().starts_with("- kind:")), "deploy/{f}: one subject a line");
    }
    let accounts = deploy_file("base/serviceaccounts.yaml");
    let api = accounts.split("\n---\n").find(|d| d.contains("name: onramp-api")).expect("onramp-api in deploy/base");
    assert!(api.contains("automountServiceAccountToken: false"), "the API's service account gets no token");
}

#[test]
fn the_registry_of_the_kubernetes_base_loads() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/base/tenants.yaml");
    let registry = onramp::domain::tenants::TenantRegistry::load(&path).unwrap_or_else(|e| panic!("{e}"));
    assert!(registry.tenant("foo").is_some(), "the runbook's tenant foo");
}

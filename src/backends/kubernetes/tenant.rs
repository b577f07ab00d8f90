//! Tenant-level resources: the isolation NetworkPolicy (runbook, "Per-tenant K8s
//! NetworkPolicy"), `reserved.tenant` node labels, the tenant's Slurm cluster and Reservation
//! custom resources, and `rollout restart` of the login Deployment.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use serde_json::json;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::keys::FIELD_MANAGER;
use super::settings::ResourcePath;
use super::{Call, K8s, K8sError};
use crate::domain::tenants::K8sNames;

/// The node label whose value marks a tenant's nodes (`reserved.tenant=<account>` by default).
pub const TENANT_LABEL: &str = "reserved.tenant";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Deleted,
    AlreadyGone,
}

/// The runbook's per-tenant NetworkPolicy: traffic only within the tenant's namespace and the
/// Slurm control namespace, plus DNS to kube-system.
pub fn network_policy(names: &K8sNames, slurm_namespace: &str) -> serde_json::Value {
    let ns = |n: &str| json!({"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": n}}});
    let own = names.namespace.as_str();
    json!({
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": names.network_policy, "namespace": own},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [ns(own), ns(slurm_namespace)]}],
            "egress": [
                {"to": [ns(own), ns(slurm_namespace)]},
                {"to": [ns("kube-system")], "ports": [{"port": 53, "protocol": "UDP"}]}
            ]
        }
    })
}

/// Where `got` differs from `want` on the fields `want` sets (fields the API server adds, such as
/// defaults, are not differences), as `path: want …, got …` lines.
pub fn spec_diff(want: &serde_json::Value, got: &serde_json::Value, at: &str) -> Vec<String> {
    use serde_json::Value;
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            w.iter().flat_map(|(k, v)| spec_diff(v, g.get(k).unwrap_or(&Value::Null), &format!("{at}.{k}"))).collect()
        }
        (Value::Object(w), Value::Null) if w.is_empty() => vec![],
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            w.iter().zip(g).enumerate().flat_map(|(i, (w, g))| spec_diff(w, g, &format!("{at}[{i}]"))).collect()
        }
        (w, g) if w == g => vec![],
        (w, g) => vec![format!("{at}: onramp applied {w}, the API server has {g}")],
    }
}

impl K8s {
    /// Server-side applies the tenant's NetworkPolicy (same object twice = no change).
    pub async fn apply_network_policy(&self, names: &K8sNames) -> Result<(), K8sError> {
        let policy: NetworkPolicy = serde_json::from_value(network_policy(names, &self.settings().slurm_namespace))
            .map_err(|e| K8sError::Config(format!("NetworkPolicy: {e}")))?;
        let (ns, name) = (names.namespace.as_str(), names.network_policy.as_str());
        let api: Api<NetworkPolicy> = Api::namespaced(self.client().clone(), ns);
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let call = Call::new("patch", "networkpolicies.networking.k8s.io", Some(ns), Some(name));
        self.call(call, api.patch(name, &pp, &Patch::Apply(&policy))).await?;
        Ok(())
    }

    /// The tenant's NetworkPolicy's `spec` as the API server has it (`None`: there is none).
    pub async fn read_network_policy(&self, names: &K8sNames) -> Result<Option<serde_json::Value>, K8sError> {
        let (ns, name) = (names.namespace.as_str(), names.network_policy.as_str());
        let api: Api<NetworkPolicy> = Api::namespaced(self.client().clone(), ns);
        let call = Call::new("get", "networkpolicies.networking.k8s.io", Some(ns), Some(name));
        match self.call(call, api.get(name)).await {
            Ok(p) => Ok(Some(serde_json::to_value(p.spec).map_err(|e| K8sError::Config(e.to_string()))?)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Removes `reserved.tenant=<node_label>` from every node carrying it; returns those nodes.
    pub async fn remove_node_labels(&self, names: &K8sNames) -> Result<Vec<String>, K8sError> {
        let api: Api<Node> = Api::all(self.client().clone());
        let lp = ListParams::default().labels(&format!("{TENANT_LABEL}={}", names.node_label));
        let nodes = self.call(Call::new("list", "nodes", None, None), api.list(&lp)).await?;
        let patch = json!({"metadata": {"labels": {TENANT_LABEL: null}}});
        let mut done = Vec::new();
        for name in nodes.items.into_iter().filter_map(|n| n.metadata.name) {
            let call = Call::new("patch", "nodes", None, Some(&name));
            match self.call(call, api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))).await {
                Ok(_) => done.push(name),
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// `kubectl rollout restart`: stamps the pod template so the Deployment rolls its pods.
    pub async fn rollout_restart(&self, namespace: &str, deployment: &str) -> Result<(), K8sError> {
        let now = OffsetDateTime::now_utc().format(&Rfc3339).map_err(|e| K8sError::Config(e.to_string()))?;
        let patch =
            json!({"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": now}}}}});
        let api: Api<Deployment> = Api::namespaced(self.client().clone(), namespace);
        let call = Call::new("patch", "deployments.apps", Some(namespace), Some(deployment));
        self.call(call, api.patch(deployment, &PatchParams::default(), &Patch::Merge(&patch))).await?;
        Ok(())
    }

    /// Restarts the tenant's login Deployment.
    pub async fn restart_login(&self, names: &K8sNames) -> Result<(), K8sError> {
        self.rollout_restart(&names.namespace, &names.login_deployment).await
    }

    /// Deletes the tenant's Slurm cluster custom resource (404 = already gone).
    pub async fn delete_slurm_cluster(&self, names: &K8sNames) -> Result<Deleted, K8sError> {
        let resource = &self.settings().slurm_cluster_resource;
        self.delete_custom(resource, Some(&names.namespace), &names.slurm_cluster).await
    }

    /// Deletes the tenant's Reservation custom resource (404 = already gone).
    pub async fn delete_reservation(&self, names: &K8sNames) -> Result<Deleted, K8sError> {
        let resource = &self.settings().reservation_resource;
        self.delete_custom(resource, names.reservation_namespace.as_deref(), &names.reservation).await
    }

    async fn delete_custom(&self, resource: &str, namespace: Option<&str>, name: &str) -> Result<Deleted, K8sError> {
        let rp: ResourcePath = resource.parse().map_err(K8sError::Config)?;
        // The kind only labels the request; the URL uses group, version and plural.
        let gvk = GroupVersionKind::gvk(&rp.group, &rp.version, &rp.plural);
        let ar = ApiResource::from_gvk_with_plural(&gvk, &rp.plural);
        let api: Api<DynamicObject> = match namespace {
            Some(ns) => Api::namespaced_with(self.client().clone(), ns, &ar),
            None => Api::all_with(self.client().clone(), &ar),
        };
        let call = Call::new("delete", format!("{}.{}", rp.plural, rp.group), namespace, Some(name));
        match self.call(call, api.delete(name, &DeleteParams::default())).await {
            Ok(_) => Ok(Deleted::Deleted),
            Err(e) if e.is_not_found() => Ok(Deleted::AlreadyGone),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_matches_the_runbook() {
        let reg = crate::domain::tenants::TenantRegistry::parse("tenants: [{ name: foo, group: g }]", "t").unwrap();
        let p = network_policy(&reg.tenants[0].kubernetes, "slurm-control");
        assert_eq!(p["metadata"]["name"], "tenant-foo-isolation");
        assert_eq!(p["metadata"]["namespace"], "tenant-foo");
        assert_eq!(
            p["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "slurm-control"
        );
        assert_eq!(p["spec"]["egress"][1]["ports"][0]["port"], 53);
        let typed: NetworkPolicy = serde_json::from_value(p.clone()).unwrap();
        assert_eq!(typed.spec.clone().unwrap().policy_types.unwrap(), ["Ingress", "Egress"]);
        // read back through the typed object (as the API server answers): the same on onramp's fields
        let back = serde_json::to_value(typed.spec).unwrap();
        assert!(spec_diff(&p["spec"], &back, "spec").is_empty(), "{:?}", spec_diff(&p["spec"], &back, "spec"));
        let mut changed = back.clone();
        changed["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] =
            json!("x");
        changed["egress"].as_array_mut().unwrap().pop();
        let d = spec_diff(&p["spec"], &changed, "spec");
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(d[0].starts_with("spec.egress: onramp applied [") && d[1].contains("matchLabels.kubernetes.io/metadata.name: onramp applied \"slurm-control\", the API server has \"x\""), "{d:?}");
    }
}

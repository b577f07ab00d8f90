//! What is left of a tenant's Slurm cluster after its SlurmCluster is deleted (runbook: "operator
//! should clean up logically; verify NodeSets, Login pods, Secrets are gone").
//!
//! What belongs to the cluster is decided by **owner references**, the same links Kubernetes'
//! garbage collector follows: an object in the tenant's namespace belongs if one of its
//! `ownerReferences` is the SlurmCluster (kind `SlurmCluster`, its name), or an object that
//! belongs (a NodeSet or StatefulSet the operator made, whose pods and Secrets it owns). The
//! tenant's own objects (its authorized-keys Secret, the NetworkPolicy) have no such owner and are
//! never counted. Listed: NodeSets (`--nodeset-resource`), StatefulSets, Pods and Secrets.

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::core::GroupVersionKind;
use serde::{Deserialize, Serialize};

use super::settings::ResourcePath;
use super::{Call, K8s, K8sError};
use crate::domain::tenants::K8sNames;

/// The kind of the custom resource whose dependents are looked for.
pub const OWNER_KIND: &str = "SlurmCluster";

/// One object of the deleted cluster that is still there.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Leftover {
    pub kind: String,
    pub name: String,
}

impl std::fmt::Display for Leftover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.kind, self.name)
    }
}

/// An object as the check needs it: kind, name, uid and owners (kind, name, uid).
#[derive(Clone, Debug, Default)]
pub struct Owned {
    pub kind: String,
    pub name: String,
    pub uid: Option<String>,
    pub owners: Vec<(String, String, Option<String>)>,
}

impl Owned {
    fn from_meta(kind: &str, m: &ObjectMeta) -> Self {
        let owners = m
            .owner_references
            .iter()
            .flatten()
            .map(|r| (r.kind.clone(), r.name.clone(), Some(r.uid.clone()).filter(|u| !u.is_empty())))
            .collect();
        Self { kind: kind.into(), name: m.name.clone().unwrap_or_default(), uid: m.uid.clone(), owners }
    }
}

/// The objects among `objects` that belong to SlurmCluster `cluster`, directly or through an
/// owner that belongs (followed until nothing more is found), sorted.
pub fn belonging(objects: &[Owned], cluster: &str) -> Vec<Leftover> {
    let mut found: BTreeSet<usize> = BTreeSet::new();
    loop {
        let before = found.len();
        for (i, o) in objects.iter().enumerate() {
            if found.contains(&i) {
                continue;
            }
            let owned = o.owners.iter().any(|(kind, name, uid)| {
                (kind == OWNER_KIND && name == cluster)
                    || found.iter().map(|&j| &objects[j]).any(|p| {
                        &p.kind == kind && &p.name == name && (uid.is_none() || p.uid.is_none() || *uid == p.uid)
                    })
            });
            if owned {
                found.insert(i);
            }
        }
        if found.len() == before {
            break;
        }
    }
    let mut out: Vec<Leftover> =
        found.into_iter().map(|i| Leftover { kind: objects[i].kind.clone(), name: objects[i].name.clone() }).collect();
    out.sort();
    out
}

impl K8s {
    /// What is left of the tenant's SlurmCluster in its namespace (empty: all gone). NodeSets
    /// not installed as a resource (404 on the list) count as none.
    pub async fn cluster_leftovers(&self, names: &K8sNames) -> Result<Vec<Leftover>, K8sError> {
        let ns = names.namespace.as_str();
        let rp: ResourcePath = self.settings().nodeset_resource.parse().map_err(K8sError::Config)?;
        let lists = [
            ("NodeSet", rp.group.as_str(), rp.version.as_str(), rp.plural.as_str()),
            ("StatefulSet", "apps", "v1", "statefulsets"),
            ("Pod", "", "v1", "pods"),
            ("Secret", "", "v1", "secrets"),
        ];
        let mut objects = vec![];
        for (kind, group, version, plural) in lists {
            let gvk = GroupVersionKind::gvk(group, version, kind);
            let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
            let api: Api<DynamicObject> = Api::namespaced_with(self.client().clone(), ns, &ar);
            let resource = if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") };
            // metadata only: owners are all the check needs (and Secrets' values never reach onramp)
            let lp = ListParams::default();
            let list = api.list_metadata(&lp);
            match self.call(Call::new("list", resource, Some(ns), None), list).await {
                Ok(list) => objects.extend(list.items.iter().map(|o| Owned::from_meta(kind, &o.metadata))),
                Err(e) if e.is_not_found() && kind == "NodeSet" => {}
                Err(e) => return Err(e),
            }
        }
        Ok(belonging(&objects, &names.slurm_cluster))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(kind: &str, name: &str, uid: &str, owners: &[(&str, &str, &str)]) -> Owned {
        Owned {
            kind: kind.into(),
            name: name.into(),
            uid: Some(uid.into()),
            owners: owners.iter().map(|(k, n, u)| (k.to_string(), n.to_string(), Some(u.to_string()))).collect(),
        }
    }

    #[test]
    fn dependents_are_followed_through_their_owners() {
        let objects = [
            obj("NodeSet", "workers", "n1", &[("SlurmCluster", "cluster-foo", "c1")]),
            obj("Pod", "workers-0", "p1", &[("NodeSet", "workers", "n1")]),
            obj("StatefulSet", "login", "s1", &[("SlurmCluster", "cluster-foo", "c1")]),
            obj("Pod", "login-0", "p2", &[("StatefulSet", "login", "s1")]),
            obj("Secret", "munge-key", "x1", &[("SlurmCluster", "cluster-foo", "c1")]),
            // the tenant's own Secret, another cluster's pod, a same-named owner with another uid
            obj("Secret", "tenant-foo-authorized-keys", "x2", &[]),
            obj("Pod", "other-0", "p3", &[("SlurmCluster", "cluster-bar", "c2")]),
            obj("Pod", "stale-0", "p4", &[("NodeSet", "workers", "old-uid")]),
        ];
        let names: Vec<String> = belonging(&objects, "cluster-foo").iter().map(ToString::to_string).collect();
        assert_eq!(names, ["NodeSet/workers", "Pod/login-0", "Pod/workers-0", "Secret/munge-key", "StatefulSet/login"]);
        assert!(belonging(&objects[5..6], "cluster-foo").is_empty());
    }
}

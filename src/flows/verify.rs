//! Read-backs of the tenant and user flows' effects: a quota set and read back from the
//! filesystem, the NetworkPolicy applied and read back from the API server, and the deleted
//! SlurmCluster's objects (NodeSets, StatefulSets, pods, Secrets it owns) polled until gone.
//! A difference that stays after a few tries fails the step with what differs (needs attention).

use serde_json::json;

use super::StepResult;
use super::backends::{Backends, StepError};
use crate::backends::kubernetes::tenant::{network_policy, spec_diff};
use crate::backends::storage::{Dir, Place, Quota, StorageError};
use crate::domain::names::Username;
use crate::domain::tenants::{K8sNames, Tenant};
use crate::engine::{StepCtx, Transition};

/// How many runs a read-back that differs gets before the step fails.
const TRIES: u32 = 3;

fn differs(ctx: &StepCtx, msg: String) -> Transition {
    if ctx.attempt < TRIES { Transition::Retry(msg) } else { Transition::Fail(msg) }
}

/// A user's `$HOME`, at the tenant registry's `quotas.home.path` when it has one.
pub fn home_place(t: &Tenant, user: &Username) -> Place {
    Dir::Home(user.clone()).at(t.quotas.home.as_ref().map(|q| q.path.as_str()))
}

/// The tenant's scratch, at the registry's `quotas.scratch.path` when it has one.
pub fn scratch_place(t: &Tenant) -> Place {
    Dir::Scratch(t.name.clone()).at(t.quotas.scratch.as_ref().map(|q| q.path.as_str()))
}

/// Sets the registry's quota on `place`, reads it back and compares hard and soft limits.
pub async fn quota(
    b: &Backends,
    place: &Place,
    q: &crate::domain::tenants::Quota,
    what: &str,
    ctx: &StepCtx,
) -> StepResult {
    let quota = Quota::parse(&q.hard, &q.soft).map_err(|e| Transition::Fail(format!("{what} quota: {e}")))?;
    let at = b.storage.locate(place);
    b.storage.set_quota(place, quota).await.step(&format!("set the {what} quota"))?;
    let out = json!({ "hard": q.hard, "soft": q.soft, "path": at.path, "path_from": at.from });
    let read = match b.storage.quota(place).await {
        Err(StorageError::Unsupported(why)) => {
            return Ok(Transition::Done(json!({ "read_back": why, "set": out })));
        }
        r => r.step(&format!("read the {what} quota back"))?,
    };
    let problems = match &read {
        None => vec!["the filesystem lists no quota there".to_string()],
        Some(l) => l.diff(quota),
    };
    if !problems.is_empty() {
        let msg = format!("the {what} quota on {} does not read back as set: {}", at.path, problems.join("; "));
        return Ok(differs(ctx, msg));
    }
    Ok(Transition::Done(json!({ "hard": q.hard, "soft": q.soft, "path": at.path, "path_from": at.from,
                                "read_back": read })))
}

/// Applies the tenant's NetworkPolicy and reads it back: the fields onramp sets must be as applied.
pub async fn policy(b: &Backends, k: &K8sNames, ctx: &StepCtx) -> StepResult {
    b.k8s.apply_network_policy(k).await.step("apply the tenant's NetworkPolicy")?;
    let want = network_policy(k, &b.k8s_settings.slurm_namespace)["spec"].clone();
    let got = b.k8s.read_network_policy(k).await.step("read the tenant's NetworkPolicy back")?;
    let diff = match &got {
        None => vec!["the API server has no such NetworkPolicy".to_string()],
        Some(spec) => spec_diff(&want, spec, "spec"),
    };
    if !diff.is_empty() {
        let (ns, name) = (&k.namespace, &k.network_policy);
        return Ok(differs(
            ctx,
            format!("NetworkPolicy {ns}/{name} does not read back as applied: {}", diff.join("; ")),
        ));
    }
    let allowed = [k.namespace.as_str(), b.k8s_settings.slurm_namespace.as_str()];
    Ok(Transition::Done(json!({ "network_policy": k.network_policy, "namespace": k.namespace,
                                "read_back": "as applied", "namespaces_allowed": allowed,
                                "dns": "kube-system, UDP 53" })))
}

/// Deletes the tenant's SlurmCluster, then polls until the operator has removed what it owned;
/// past `cleanup_deadline` the job fails naming what is left.
pub async fn cluster_gone(b: &Backends, k: &K8sNames, ctx: &StepCtx) -> StepResult {
    // A poll's later runs only look: the delete was this step's first run.
    let polling = ctx.poll_deadline.is_some();
    let deleted = if polling {
        "Deleted".to_string()
    } else {
        let d = b.k8s.delete_slurm_cluster(k).await.step("delete the Slurm cluster resource")?;
        format!("{d:?}")
    };
    let left = b.k8s.cluster_leftovers(k).await.step("list what is left of the Slurm cluster")?;
    let owner = format!("SlurmCluster {}/{}", k.namespace, k.slurm_cluster);
    if left.is_empty() {
        return Ok(Transition::Done(json!({ "slurm_cluster": deleted, "name": k.slurm_cluster,
            "namespace": k.namespace, "waited_for": format!("NodeSets, StatefulSets, pods and Secrets owned by {owner}"),
            "polled": polling, "remaining": [] })));
    }
    let list: Vec<String> = left.iter().map(ToString::to_string).collect();
    if ctx.poll_expired() {
        let by_hand: Vec<String> = left.iter().map(|l| format!("{}/{}", l.kind.to_lowercase(), l.name)).collect();
        return Ok(Transition::Fail(format!(
            "{owner} is deleted but after {}s the operator has not removed what it owned: {}; check the operator's \
             logs, delete them by hand (kubectl -n {} delete {}), then retry the job",
            b.timings.cleanup_deadline.as_secs(),
            list.join(", "),
            k.namespace,
            by_hand.join(" ")
        )));
    }
    Ok(Transition::Poll { every: b.timings.cleanup_poll, for_at_most: b.timings.cleanup_deadline })
}

#[cfg(test)]
#[path = "verify_tests.rs"]
mod tests;

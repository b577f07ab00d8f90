//! Tenant onboarding and offboarding against the real Slurm and the fake Kubernetes API.

use std::time::Duration;

use onramp::engine::{Actor, JobState};
use onramp::flows::tenant::{OFFBOARD_STEPS, TENANT_OFFBOARD, TENANT_ONBOARD, job};
use onramp::flows::user_onboard::USER_ONBOARD;
use serde_json::json;

use crate::common::{eventually, wait_state};
use crate::flows_support::{CAROL, Harness, UNIX_USER, short};

const T: Duration = Duration::from_secs(90);

#[tokio::test]
async fn a_tenant_is_onboarded_and_offboarded_in_order() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.add_carol(true);
    h.sync_key();

    // Onboarding: accounts with limits, NetworkPolicy, scratch quota, the group's members.
    let id = h.engine.enqueue(&[job(TENANT_ONBOARD, &h.tenant, Actor::cli("ops"))]).await.unwrap()[0].id;
    let j = wait_state(&h.engine, id, "succeeded", T).await;
    let rows = h.assocs().await;
    let top = rows.iter().find(|r| r[0] == h.account && r[1].is_empty()).expect("tenant account");
    assert_eq!(top[6], "300", "{rows:?}");
    assert!(rows.iter().any(|r| r[0] == h.team && r[1].is_empty()), "{rows:?}");
    assert!(rows.iter().any(|r| r[0] == h.team && r[1] == UNIX_USER), "member added in the batch: {rows:?}");
    assert_eq!(j.outputs["members"]["batches"][0]["users"], json!([UNIX_USER]), "{}", j.outputs);
    // the runbook's names: namespace tenant-<name>, the rest after the namespace or the account
    let ns = format!("tenant-{}", h.tenant);
    assert_eq!(h.names.namespace, ns);
    let np = format!("/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies/{ns}-isolation");
    assert!(h.k8s.get(&np).is_some(), "{:?}", h.k8s.requests());
    assert!(
        h.storage_calls().iter().any(|c| c.join(" ").contains(&format!("quota set /tenant/{}/scratch", h.tenant))),
        "{:?}",
        h.storage_calls()
    );
    let onboard =
        eventually(T, "the member's onboarding job", || async { h.jobs(USER_ONBOARD).await.first().map(|j| j.0) })
            .await;
    wait_state(&h.engine, onboard, "succeeded", T).await;

    // The tenant's Kubernetes objects the offboarding removes.
    let a = &h.account;
    let cr = format!("/apis/slurm.nebius.ai/v1/namespaces/{ns}/slurmclusters/cluster-{a}");
    h.k8s.put(&cr, json!({"apiVersion": "slurm.nebius.ai/v1", "kind": "SlurmCluster", "metadata": {"name": format!("cluster-{a}"), "namespace": ns}}));
    let res = format!("/apis/slurm.nebius.ai/v1/namespaces/{ns}/reservations/{a}-reservation");
    h.k8s.put(&res, json!({"apiVersion": "slurm.nebius.ai/v1", "kind": "Reservation", "metadata": {"name": format!("{a}-reservation"), "namespace": ns}}));
    let node = format!("/api/v1/nodes/gpu-{}", h.tenant);
    h.k8s.put(&node, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("gpu-{}", h.tenant), "labels": {"reserved.tenant": a, "kind": "gpu"}}}));
    // another tenant's node (its label is the tenant name, not this tenant's account) is left alone
    let other = format!("/api/v1/nodes/gpu-other-{}", h.tenant);
    h.k8s.put(&other, json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": format!("gpu-other-{}", h.tenant), "labels": {"reserved.tenant": h.tenant}}}));

    let id = h.engine.enqueue(&[job(TENANT_OFFBOARD, &h.tenant, Actor::cli("ops"))]).await.unwrap()[0].id;
    // nothing happens before a second person approves: the starter cannot
    let waiting = wait_state(&h.engine, id, "needs_approval", T).await;
    assert_eq!(waiting.step, "confirm");
    let e = h.engine.approve(id, &Actor::cli("ops")).await.unwrap_err();
    assert!(e.to_string().starts_with("four eyes:"), "{e}");
    assert!(h.k8s.get(&cr).is_some(), "nothing was changed before the approval");
    h.engine.approve(id, &Actor::cli("reviewer")).await.unwrap();
    let done = eventually(T, "the tenant offboarding to end", || async {
        let j = h.engine.job(id).await.unwrap();
        matches!(j.state.as_str(), "succeeded" | "failed").then_some(j)
    })
    .await;
    assert_eq!(done.state, JobState::Succeeded, "{:?} at {}: {}", done.last_error, done.step, done.outputs);
    assert!(h.k8s.get(&cr).is_none(), "the SlurmCluster is deleted");
    assert!(h.k8s.get(&res).is_none(), "the Reservation is deleted");
    assert_eq!(h.k8s.get(&node).unwrap()["metadata"]["labels"], json!({"kind": "gpu"}));
    assert_eq!(h.k8s.get(&other).unwrap()["metadata"]["labels"], json!({"reserved.tenant": h.tenant}));
    assert!(h.assocs().await.is_empty(), "accounts deleted: {:?}", h.assocs().await);
    let snaps: Vec<String> = h.storage_calls().iter().map(|c| c.join(" ")).filter(|c| c.contains("snapshot")).collect();
    assert!(snaps.iter().any(|c| c.contains(&format!("offboard-final-{}", h.tenant))), "{snaps:?}");
    assert!(snaps.iter().any(|c| c.contains(&format!("offboard-{UNIX_USER}-"))), "{snaps:?}");
    // Block, cancel, drain, CR, snapshot, archive, labels, retention, delete: in that order.
    let runs = h.engine.step_runs(id).await.unwrap();
    let mut order: Vec<&str> = runs.iter().map(|r| r.step.as_str()).collect();
    order.dedup();
    assert_eq!(order, OFFBOARD_STEPS.to_vec());
}

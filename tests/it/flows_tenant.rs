//! Tenant onboarding and offboarding against the real Slurm and the fake Kubernetes API.

use std::time::Duration;

use onramp::engine::{Actor, JobState};
use onramp::flows::Timings;
use onramp::flows::tenant::{OFFBOARD_STEPS, TENANT_OFFBOARD, TENANT_ONBOARD, job};
use onramp::flows::user_onboard::USER_ONBOARD;
use onramp_fakes::k8s::operator::Operator;
use serde_json::{Value, json};

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
    // read back: the policy as applied, the quota as the filesystem lists it, at the registry's path
    assert_eq!(j.outputs["network_policy"]["read_back"], "as applied", "{}", j.outputs);
    let sq = &j.outputs["scratch_quota"];
    assert_eq!(
        (sq["path"].as_str(), sq["path_from"].as_str()),
        (Some(&*format!("/tenant/{}/scratch", h.tenant)), Some("registry"))
    );
    assert_eq!(sq["read_back"]["hard_bytes"], 50_000_000_000_000u64, "{sq}");
    let list = format!("quota list scratch --path /tenant/{}/scratch --all -J", h.tenant);
    assert!(h.storage_calls().iter().any(|c| c.join(" ").contains(&list)), "{:?}", h.storage_calls());
    let onboard =
        eventually(T, "the member's onboarding job", || async { h.jobs(USER_ONBOARD).await.first().map(|j| j.0) })
            .await;
    let member = wait_state(&h.engine, onboard, "succeeded", T).await;
    assert_eq!(member.outputs["home_quota"]["path"], format!("/home/{UNIX_USER}"), "{}", member.outputs);
    assert_eq!(member.outputs["home_quota"]["path_from"], "registry");
    // `{tenant}` in the login address is the tenant's name, in the step's output and the e-mail
    let login = format!("login.{}.example", h.tenant);
    assert_eq!(member.outputs["notify"]["login_address"], login.as_str(), "{}", member.outputs);
    let mails = eventually(T, "the e-mail", || async { Some(h.smtpd.messages()).filter(|m| !m.is_empty()) }).await;
    assert!(mails[0].contains(&format!("ssh {UNIX_USER}@{login}")), "{}", mails[0]);
    assert!(!h.storage_calls().iter().any(|c| c.join(" ").contains("/from-settings")), "{:?}", h.storage_calls());

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

    // What the operator made for the cluster: collected some time after the SlurmCluster goes.
    let owned = cluster_objects(&h, &ns);
    h.k8s.operator(Operator { stuck: false, gc_delay_ms: 400 });

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
    let dc = &done.outputs["delete_cluster"];
    assert_eq!(dc["polled"], true, "the step waited for the operator: {dc}");
    assert_eq!(dc["remaining"], json!([]));
    assert!(dc["waited_for"].as_str().unwrap().contains(&format!("SlurmCluster {ns}/cluster-{a}")), "{dc}");
    assert!(owned.iter().all(|u| h.k8s.get(u).is_none()), "the cluster's NodeSet, pod and Secret are gone");
    let keys = format!("/api/v1/namespaces/{ns}/secrets/{}", h.names.keys_secret);
    assert!(h.k8s.get(&keys).is_some(), "the tenant's own key Secret is not the cluster's");
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

/// The operator's objects of the tenant's SlurmCluster (a NodeSet and its pod, a Secret); their URLs.
fn cluster_objects(h: &Harness, ns: &str) -> Vec<String> {
    let c = format!("cluster-{}", h.account);
    let owner = |kind: &str, name: &str| json!([{"apiVersion": "x/v1", "kind": kind, "name": name, "uid": format!("{name}-uid")}]);
    let obj = |kind: &str, name: &str, owners: Value| json!({"kind": kind, "metadata": {"name": name, "namespace": ns, "uid": format!("{name}-uid"), "ownerReferences": owners}});
    let cr = format!("/apis/slurm.nebius.ai/v1/namespaces/{ns}/slurmclusters/{c}");
    h.k8s.put(&cr, obj("SlurmCluster", &c, json!([])));
    let urls = vec![
        format!("/apis/slurm.nebius.ai/v1alpha1/namespaces/{ns}/nodesets/gpu"),
        format!("/api/v1/namespaces/{ns}/pods/gpu-0"),
        format!("/api/v1/namespaces/{ns}/secrets/{c}-munge"),
    ];
    h.k8s.put(&urls[0], obj("NodeSet", "gpu", owner("SlurmCluster", &c)));
    h.k8s.put(&urls[1], obj("Pod", "gpu-0", owner("NodeSet", "gpu")));
    h.k8s.put(&urls[2], obj("Secret", &format!("{c}-munge"), owner("SlurmCluster", &c)));
    urls
}

#[tokio::test]
async fn a_stuck_operator_leaves_the_offboarding_needing_attention_with_what_remains() {
    let h = Harness::start(Timings { cleanup_deadline: Duration::from_secs(1), ..short() }).await;
    h.ensure_tenant_accounts().await;
    let ns = h.names.namespace.clone();
    cluster_objects(&h, &ns);
    h.k8s.operator(Operator { stuck: true, gc_delay_ms: 0 });
    let id = h.engine.enqueue(&[job(TENANT_OFFBOARD, &h.tenant, Actor::cli("ops"))]).await.unwrap()[0].id;
    wait_state(&h.engine, id, "needs_approval", T).await;
    h.engine.approve(id, &Actor::cli("reviewer")).await.unwrap();
    let j = wait_state(&h.engine, id, "failed", T).await;
    assert_eq!(j.step, "delete_cluster");
    let e = j.last_error.unwrap_or_default();
    let c = format!("cluster-{}", h.account);
    for want in ["NodeSet/gpu", "Pod/gpu-0", &format!("Secret/{c}-munge"), &format!("SlurmCluster {ns}/{c} is deleted")]
    {
        assert!(e.contains(want), "{want:?} in {e}");
    }
    // nothing after it ran: the snapshot, archive and deletes wait for a person
    assert!(j.outputs.get("snapshot").is_none(), "{}", j.outputs);
    assert!(!h.assocs().await.is_empty(), "the accounts are still there");
}

#[tokio::test]
async fn a_quota_that_does_not_read_back_as_set_fails_the_step_with_the_difference() {
    let h = Harness::start(short()).await;
    // the filesystem lists another quota on the scratch path and drops what it is given
    let path = format!("/tenant/{}/scratch", h.tenant);
    let dir = h.storage_dir.path();
    std::fs::write(
        dir.join("quotas.json"),
        json!({ path.clone(): [1_000_000_000_000u64, 900_000_000_000u64] }).to_string(),
    )
    .unwrap();
    std::fs::write(dir.join("ignore-sets"), "").unwrap();
    let id = h.engine.enqueue(&[job(TENANT_ONBOARD, &h.tenant, Actor::cli("ops"))]).await.unwrap()[0].id;
    let j = wait_state(&h.engine, id, "failed", T).await;
    assert_eq!(j.step, "scratch_quota");
    let e = j.last_error.unwrap_or_default();
    assert!(e.contains(&format!("the scratch quota on {path} does not read back as set")), "{e}");
    assert!(e.contains("hard: set 50TB (50000000000000 bytes), read back 1000000000000 bytes"), "{e}");
    assert!(e.contains("soft: set 45TB (45000000000000 bytes), read back 900000000000 bytes"), "{e}");
    let sets = h.storage_calls().iter().filter(|c| c.join(" ").contains(&format!("quota set {path}"))).count();
    assert_eq!(sets, 3, "set and read back on each of the step's tries");

    // A plan shows the read-back and the login address with the tenant's name.
    let req = onramp::dryrun::plan::PlanRequest {
        flow: TENANT_ONBOARD.into(),
        tenant: onramp::domain::names::TenantName::parse(&h.tenant).unwrap(),
        user: None,
        account: None,
        hard_cutoff: false,
    };
    let ak = std::sync::Arc::new(crate::intake_support::client(&h.ak_url));
    let p = onramp::dryrun::plan::plan(&req, &h.dry, h.backends.tenants.clone(), Some(ak)).await.unwrap();
    assert_eq!(p.stopped, None, "{}", p.text());
    assert!(p.text().contains(&format!("login: login.{}.example", h.tenant)), "{}", p.text());
    assert!(p.text().contains(&format!("quota list scratch --path {path}")), "{}", p.text());
    assert!(p.text().contains("networkpolicies/") && p.text().contains("GET"), "{}", p.text());
}

#[tokio::test]
async fn a_snapshot_deleted_by_hand_during_retention_keeps_the_tenants_accounts() {
    let h = Harness::start(Timings { retention: Duration::from_secs(4), ..short() }).await;
    h.ensure_tenant_accounts().await;
    let id = h.engine.enqueue(&[job(TENANT_OFFBOARD, &h.tenant, Actor::cli("ops"))]).await.unwrap()[0].id;
    wait_state(&h.engine, id, "needs_approval", T).await;
    h.engine.approve(id, &Actor::cli("reviewer")).await.unwrap();
    let waiting = wait_state(&h.engine, id, "waiting", T).await;
    assert_eq!(waiting.step, "retention", "{}", waiting.outputs);
    let scratch = waiting.outputs["snapshot"]["snapshots"][0]["snapshot"].as_str().unwrap().to_string();
    // the fake filesystem keeps each snapshot as a file <fs>@<name>
    let file = std::fs::read_dir(h.storage_dir.path().join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(&format!("@{scratch}")))
        .expect("the scratch snapshot");
    std::fs::remove_file(&file).unwrap();

    let j = wait_state(&h.engine, id, "failed", T).await;
    assert_eq!(j.step, "delete_accounts");
    let e = j.last_error.unwrap_or_default();
    assert!(e.contains(&format!("the snapshot(s) {scratch} of tenant {}", h.tenant)), "{e}");
    assert!(e.contains("nothing was deleted"), "{e}");
    assert!(!h.assocs().await.is_empty(), "the accounts are still there");
    assert!(file.exists(), "the snapshot was taken again for the person who retries");

    // The person looked and retries: the snapshot is there now, the accounts go.
    h.engine.retry(id, &Actor::cli("ops")).await.unwrap();
    wait_state(&h.engine, id, "succeeded", T).await;
    assert!(h.assocs().await.is_empty(), "accounts deleted: {:?}", h.assocs().await);
}

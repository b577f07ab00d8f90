//! The Kubernetes backend against the fake API server: the key Secret, server-side apply,
//! tenant resources, and faults.

use std::time::Duration;

use axum::http::Method;
use onramp::backends::kubernetes::K8sError;
use onramp::backends::kubernetes::keys::{Applied, KeyState};
use onramp::backends::kubernetes::tenant::Deleted;
use onramp::domain::names::Username;
use onramp::domain::sshkey::PublicKey;
use onramp::domain::tenants::K8sNames;
use serde_json::json;

use crate::k8s_support::{TENANT, client, cluster, tenant};
use onramp_fakes::k8s::Fault;

const ALICE: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";
const BOB: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIEbsZxVsY8Yr1gYU8e7x0zaF1bZKtOjM1i+7yJ0a4qaX bob";
const SECRET: &str = "/api/v1/namespaces/tenant-foo/secrets/tenant-foo-authorized-keys";

fn b64(s: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[tokio::test]
async fn key_secret_is_read_and_compared() {
    let (fake, k8s) = cluster().await;
    let (alice, bob) = (Username::parse("alice").unwrap(), Username::parse("bob").unwrap());
    let key = PublicKey::parse(ALICE).unwrap();
    assert_eq!(k8s.key_state(&tenant(), &alice, &key).await.unwrap(), KeyState::NoSecret);
    fake.put(SECRET, json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tenant-foo-authorized-keys", "namespace": TENANT},
        "data": {"alice": b64(&format!("{}\n", ALICE.replace("alice@laptop", "from-authentik"))), "bob": b64(ALICE)}}));
    assert_eq!(k8s.key_state(&tenant(), &alice, &key).await.unwrap(), KeyState::Matches);
    let other = PublicKey::parse(BOB).unwrap();
    let KeyState::Differs { found } = k8s.key_state(&tenant(), &bob, &other).await.unwrap() else { panic!() };
    assert_eq!(found, [key.fingerprint()]);
    assert_eq!(k8s.key_state(&tenant(), &Username::parse("carol").unwrap(), &key).await.unwrap(), KeyState::Missing);
}

#[tokio::test]
async fn managed_keys_use_server_side_apply() {
    let (fake, k8s) = cluster().await;
    let (alice, bob) = (Username::parse("alice").unwrap(), Username::parse("bob").unwrap());
    let (ka, kb) = (PublicKey::parse(ALICE).unwrap(), PublicKey::parse(BOB).unwrap());
    let e = k8s.put_key(&tenant(), &alice, &ka).await.unwrap_err();
    assert!(matches!(e, K8sError::Config(_)), "writing needs --manage-keys");

    let k8s = client(&fake, |s| s.manage_keys = true);
    assert_eq!(k8s.put_key(&tenant(), &alice, &ka).await.unwrap(), Applied::Changed);
    assert_eq!(k8s.put_key(&tenant(), &bob, &kb).await.unwrap(), Applied::Changed);
    assert_eq!(k8s.put_key(&tenant(), &alice, &ka).await.unwrap(), Applied::Unchanged);
    assert_eq!(k8s.key_state(&tenant(), &alice, &ka).await.unwrap(), KeyState::Matches);
    assert_eq!(k8s.key_state(&tenant(), &bob, &kb).await.unwrap(), KeyState::Matches);
    let (ct, path, body) = fake.patches().last().cloned().unwrap();
    assert_eq!(ct, "application/apply-patch+yaml");
    assert!(path.ends_with("tenant-foo-authorized-keys"));
    assert!(body["metadata"]["resourceVersion"].is_string(), "writes are conditional on what was read");
    let (m, url) = fake.requests().into_iter().rfind(|(m, _)| m == Method::PATCH).unwrap();
    assert!(url.contains("fieldManager=onramp") && url.contains("force=true"), "{m} {url}");

    assert_eq!(k8s.remove_key(&tenant(), &alice).await.unwrap(), Applied::Changed);
    assert_eq!(k8s.remove_key(&tenant(), &alice).await.unwrap(), Applied::Unchanged);
    let data = fake.get(SECRET).unwrap()["data"].clone();
    assert!(data.get("alice").is_none() && data.get("bob").is_some(), "{data}");

    // Someone else changed the Secret between our read and our write: 409; read and applied again.
    let patches = fake.patches().len();
    fake.fault(Method::PATCH, "authorized-keys", Fault::Status(409, None));
    assert_eq!(k8s.put_key(&tenant(), &alice, &ka).await.unwrap(), Applied::Changed);
    assert_eq!(fake.patches().len(), patches + 1, "the conflicting patch was not taken; the next one was");
    assert_eq!(k8s.key_state(&tenant(), &alice, &ka).await.unwrap(), KeyState::Matches);
    // A conflict on every try: after a few, a retryable error for the step.
    for _ in 0..8 {
        fake.fault(Method::PATCH, "authorized-keys", Fault::Status(409, None));
    }
    let e = k8s.remove_key(&tenant(), &alice).await.unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("409"), "{e}");
}

/// Twenty users' first keys at once, on a tenant whose Secret does not exist yet: every write
/// carries a version (the Secret is created empty first), so retrying on 409 loses none of them;
/// in one process they take turns, so none needs the step's retry.
#[tokio::test]
async fn concurrent_first_keys_are_all_kept() {
    let (fake, _) = cluster().await;
    let k8s = std::sync::Arc::new(client(&fake, |s| s.manage_keys = true));
    let key = PublicKey::parse(ALICE).unwrap();
    let writes = (0..20).map(|i| {
        let (k8s, key) = (k8s.clone(), key.clone());
        tokio::spawn(async move {
            let user = Username::parse(&format!("user{i}")).unwrap();
            for attempt in 1..=50 {
                match k8s.put_key(&tenant(), &user, &key).await {
                    Ok(_) => return attempt,
                    Err(e) if e.is_retryable() => continue,
                    Err(e) => panic!("{e}"),
                }
            }
            panic!("{user} never got written");
        })
    });
    for w in writes.collect::<Vec<_>>() {
        assert_eq!(w.await.unwrap(), 1, "a write needed the step's retry");
    }
    let data = fake.get(SECRET).unwrap()["data"].clone();
    let kept = (0..20).filter(|i| data.get(format!("user{i}")).is_some()).count();
    assert_eq!(kept, 20, "{data}");
    assert!(fake.patches().iter().all(|(_, _, b)| b["metadata"]["resourceVersion"].is_string()));
}

#[tokio::test]
async fn tenant_resources() {
    let (fake, k8s) = cluster().await;
    let t = tenant();
    k8s.apply_network_policy(&t).await.unwrap();
    k8s.apply_network_policy(&t).await.unwrap();
    let np = fake.get("/apis/networking.k8s.io/v1/namespaces/tenant-foo/networkpolicies/tenant-foo-isolation").unwrap();
    assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
    assert_eq!(
        np["spec"]["egress"][1]["to"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "kube-system"
    );

    for (n, owner) in [("gpu-1", Some(TENANT)), ("gpu-2", Some(TENANT)), ("gpu-3", Some("tenant-bar")), ("cpu-1", None)]
    {
        let labels = owner.map_or(json!({"kind": "cpu"}), |o| json!({"reserved.tenant": o, "kind": "gpu"}));
        fake.put(
            &format!("/api/v1/nodes/{n}"),
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": labels}}),
        );
    }
    assert_eq!(k8s.remove_node_labels(&t).await.unwrap(), ["gpu-1", "gpu-2"]);
    assert_eq!(fake.get("/api/v1/nodes/gpu-1").unwrap()["metadata"]["labels"], json!({"kind": "gpu"}));
    assert_eq!(fake.get("/api/v1/nodes/gpu-3").unwrap()["metadata"]["labels"]["reserved.tenant"], "tenant-bar");
    assert!(k8s.remove_node_labels(&t).await.unwrap().is_empty());

    let cr = "/apis/slurm.nebius.ai/v1/namespaces/tenant-foo/slurmclusters/cluster-tenant-foo";
    fake.put(
        cr,
        json!({"apiVersion": "slurm.nebius.ai/v1", "kind": "SlurmCluster", "metadata": {"name": "cluster-tenant-foo"}}),
    );
    assert_eq!(k8s.delete_slurm_cluster(&t).await.unwrap(), Deleted::Deleted);
    assert!(fake.get(cr).is_none());
    assert_eq!(k8s.delete_slurm_cluster(&t).await.unwrap(), Deleted::AlreadyGone);
    // the runbook's Reservation, in the tenant's namespace by default
    let res = "/apis/slurm.nebius.ai/v1/namespaces/tenant-foo/reservations/tenant-foo-reservation";
    fake.put(res, json!({"apiVersion": "slurm.nebius.ai/v1", "kind": "Reservation", "metadata": {"name": "tenant-foo-reservation"}}));
    assert_eq!(k8s.delete_reservation(&t).await.unwrap(), Deleted::Deleted);
    assert!(fake.get(res).is_none());
    // another operator's, cluster-scoped (`reservation_namespace: "-"` in the registry)
    let k8s_slinky = client(&fake, |s| s.reservation_resource = "slinky.slurm.net/v1alpha1/reservations".into());
    let cluster_scoped = K8sNames { reservation_namespace: None, ..t.clone() };
    let res = "/apis/slinky.slurm.net/v1alpha1/reservations/tenant-foo-reservation";
    fake.put(res, json!({"apiVersion": "slinky.slurm.net/v1alpha1", "kind": "Reservation", "metadata": {"name": "tenant-foo-reservation"}}));
    assert_eq!(k8s_slinky.delete_reservation(&cluster_scoped).await.unwrap(), Deleted::Deleted);
    assert!(fake.get(res).is_none());

    k8s.restart_login(&t).await.unwrap();
    let d = fake.get("/apis/apps/v1/namespaces/tenant-foo/deployments/login").unwrap();
    let stamp = d["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(time::OffsetDateTime::parse(&stamp, &time::format_description::well_known::Rfc3339).is_ok(), "{stamp}");
    assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "login", "merge patch keeps the rest");
}

#[tokio::test]
async fn api_faults_are_typed() {
    let (fake, k8s) = cluster().await;
    let (t, alice) = (tenant(), Username::parse("alice").unwrap());
    let key = PublicKey::parse(ALICE).unwrap();

    fake.fault(Method::GET, "authorized-keys", Fault::Status(500, None));
    let e = k8s.key_state(&t, &alice, &key).await.unwrap_err();
    assert!(matches!(e, K8sError::Api { code: 500, .. }) && e.is_retryable(), "{e}");

    fake.fault(Method::GET, "authorized-keys", Fault::Status(429, Some(7)));
    let e = k8s.key_state(&t, &alice, &key).await.unwrap_err();
    assert!(e.is_retryable(), "{e}");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(7)), "{e}");

    fake.fault(Method::GET, "authorized-keys", Fault::Delay(Duration::from_secs(4)));
    let e = k8s.key_state(&t, &alice, &key).await.unwrap_err();
    assert!(matches!(e, K8sError::Timeout { .. }) && e.is_retryable(), "{e}");

    fake.fault(Method::GET, "authorized-keys", Fault::Status(403, None));
    let e = k8s.key_state(&t, &alice, &key).await.unwrap_err();
    assert!(!e.is_retryable());
    let msg = e.to_string();
    assert!(
        msg.contains("\"get\" on \"secrets\" in namespace tenant-foo") && msg.contains("deploy/rbac.yaml"),
        "{msg}"
    );

    fake.fault(Method::PATCH, "/nodes/", Fault::Status(403, None));
    fake.put("/api/v1/nodes/gpu-1", json!({"metadata": {"name": "gpu-1", "labels": {"reserved.tenant": TENANT}}}));
    let e = k8s.remove_node_labels(&t).await.unwrap_err();
    assert!(e.to_string().contains("\"patch\" on \"nodes\" cluster-wide"), "{e}");

    // Nothing listens: a connection error, retryable.
    let dead = onramp::backends::kubernetes::K8s::for_url("http://127.0.0.1:9", k8s.settings().clone()).unwrap();
    let e = dead.key_state(&t, &alice, &key).await.unwrap_err();
    assert!(matches!(e, K8sError::Connection { .. }) && e.is_retryable(), "{e}");
}

/// A tenant whose names the registry overrides: every call uses them, none the runbook's.
#[tokio::test]
async fn a_tenants_own_names_from_the_registry_are_the_ones_used() {
    let reg = onramp::domain::tenants::TenantRegistry::parse(
        "tenants:
  - name: foo
    group: g
    kubernetes:
      namespace: team-foo
      keys_secret: ssh-keys
      network_policy: fence
      login_deployment: sshd
      slurm_cluster: slurm
      reservation: nodes
      node_label: pool-a
",
        "test",
    )
    .unwrap();
    let t = reg.tenants[0].kubernetes.clone();
    let (fake, _) = cluster().await;
    let k8s = client(&fake, |s| s.manage_keys = true);
    let alice = Username::parse("alice").unwrap();
    let key = PublicKey::parse(ALICE).unwrap();
    assert_eq!(k8s.put_key(&t, &alice, &key).await.unwrap(), Applied::Changed);
    assert!(fake.get("/api/v1/namespaces/team-foo/secrets/ssh-keys").is_some());
    assert_eq!(k8s.key_state(&t, &alice, &key).await.unwrap(), KeyState::Matches);
    k8s.apply_network_policy(&t).await.unwrap();
    let np = fake.get("/apis/networking.k8s.io/v1/namespaces/team-foo/networkpolicies/fence").unwrap();
    assert_eq!(
        np["spec"]["ingress"][0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
        "team-foo"
    );
    fake.deployment("team-foo", "sshd", json!({"app": "sshd"}));
    k8s.restart_login(&t).await.unwrap();
    let d = fake.get("/apis/apps/v1/namespaces/team-foo/deployments/sshd").unwrap();
    assert!(d["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"].is_string());
    fake.put("/api/v1/nodes/gpu-1", json!({"metadata": {"name": "gpu-1", "labels": {"reserved.tenant": "pool-a"}}}));
    fake.put("/api/v1/nodes/gpu-2", json!({"metadata": {"name": "gpu-2", "labels": {"reserved.tenant": TENANT}}}));
    assert_eq!(k8s.remove_node_labels(&t).await.unwrap(), ["gpu-1"]);
    let cr = "/apis/slurm.nebius.ai/v1/namespaces/team-foo/slurmclusters/slurm";
    fake.put(cr, json!({"apiVersion": "slurm.nebius.ai/v1", "kind": "SlurmCluster", "metadata": {"name": "slurm"}}));
    assert_eq!(k8s.delete_slurm_cluster(&t).await.unwrap(), Deleted::Deleted);
    let res = "/apis/slurm.nebius.ai/v1/namespaces/team-foo/reservations/nodes";
    fake.put(res, json!({"apiVersion": "slurm.nebius.ai/v1", "kind": "Reservation", "metadata": {"name": "nodes"}}));
    assert_eq!(k8s.delete_reservation(&t).await.unwrap(), Deleted::Deleted);
    assert!(fake.get(cr).is_none() && fake.get(res).is_none());
}

/// An object of `kind` in the tenant's namespace, owned by `owner` (kind, name, uid).
fn owned(kind: &str, name: &str, uid: &str, owner: Option<(&str, &str, &str)>) -> serde_json::Value {
    let refs: Vec<_> =
        owner.map(|(k, n, u)| json!({"apiVersion": "x/v1", "kind": k, "name": n, "uid": u})).into_iter().collect();
    json!({"kind": kind, "metadata": {"name": name, "namespace": TENANT, "uid": uid, "ownerReferences": refs}})
}

/// The tenant's SlurmCluster with what the operator made for it: a NodeSet and its pod, the login
/// StatefulSet and its pod, a Secret; and the tenant's own key Secret (never the cluster's).
fn cluster_objects(fake: &onramp_fakes::k8s::FakeK8s) {
    let ns = format!("/api/v1/namespaces/{TENANT}");
    let c = ("SlurmCluster", "cluster-tenant-foo", "c-1");
    let cr = format!("/apis/slurm.nebius.ai/v1/namespaces/{TENANT}/slurmclusters/cluster-tenant-foo");
    fake.put(&cr, owned("SlurmCluster", "cluster-tenant-foo", "c-1", None));
    let sets = format!("/apis/slurm.nebius.ai/v1alpha1/namespaces/{TENANT}/nodesets");
    fake.put(&format!("{sets}/gpu"), owned("NodeSet", "gpu", "n-1", Some(c)));
    fake.put(&format!("{ns}/pods/gpu-0"), owned("Pod", "gpu-0", "p-1", Some(("NodeSet", "gpu", "n-1"))));
    let sts = format!("/apis/apps/v1/namespaces/{TENANT}/statefulsets/login");
    fake.put(&sts, owned("StatefulSet", "login", "s-1", Some(c)));
    fake.put(&format!("{ns}/pods/login-1"), owned("Pod", "login-1", "p-2", Some(("StatefulSet", "login", "s-1"))));
    fake.put(&format!("{ns}/secrets/munge-key"), owned("Secret", "munge-key", "x-1", Some(c)));
    fake.put(SECRET, owned("Secret", "tenant-foo-authorized-keys", "x-2", None));
}

#[tokio::test]
async fn a_deleted_clusters_objects_are_collected_and_what_is_left_is_named() {
    use onramp_fakes::k8s::operator::Operator;
    let (fake, k8s) = cluster().await;
    cluster_objects(&fake);
    let left: Vec<String> = k8s.cluster_leftovers(&tenant()).await.unwrap().iter().map(ToString::to_string).collect();
    assert_eq!(left, ["NodeSet/gpu", "Pod/gpu-0", "Pod/login-1", "Secret/munge-key", "StatefulSet/login"]);
    // the operator's garbage collection comes some time after the delete
    fake.operator(Operator { stuck: false, gc_delay_ms: 200 });
    assert_eq!(k8s.delete_slurm_cluster(&tenant()).await.unwrap(), Deleted::Deleted);
    assert_eq!(k8s.cluster_leftovers(&tenant()).await.unwrap().len(), 5, "not collected at once");
    crate::common::eventually(Duration::from_secs(10), "the cluster's objects to go", || async {
        k8s.cluster_leftovers(&tenant()).await.unwrap().is_empty().then_some(())
    })
    .await;
    assert!(fake.get(SECRET).is_some(), "the tenant's own key Secret stays");
    assert!(fake.get("/api/v1/namespaces/tenant-foo/pods/login-0").is_some(), "an unowned pod stays");

    // a stuck operator leaves them
    let (fake, k8s) = cluster().await;
    cluster_objects(&fake);
    fake.operator(Operator { stuck: true, gc_delay_ms: 0 });
    k8s.delete_slurm_cluster(&tenant()).await.unwrap();
    assert_eq!(k8s.cluster_leftovers(&tenant()).await.unwrap().len(), 5);
}

#[tokio::test]
async fn the_network_policy_reads_back_as_applied() {
    use onramp::backends::kubernetes::tenant::{network_policy, spec_diff};
    let (fake, k8s) = cluster().await;
    assert_eq!(k8s.read_network_policy(&tenant()).await.unwrap(), None);
    k8s.apply_network_policy(&tenant()).await.unwrap();
    let want = network_policy(&tenant(), "slurm-control")["spec"].clone();
    let got = k8s.read_network_policy(&tenant()).await.unwrap().unwrap();
    assert!(spec_diff(&want, &got, "spec").is_empty(), "{:?}", spec_diff(&want, &got, "spec"));
    // someone else's change to the policy is a difference
    let url = "/apis/networking.k8s.io/v1/namespaces/tenant-foo/networkpolicies/tenant-foo-isolation";
    let mut p = fake.get(url).unwrap();
    p["spec"]["egress"][1]["ports"][0]["port"] = json!(5353);
    fake.put(url, p);
    let got = k8s.read_network_policy(&tenant()).await.unwrap().unwrap();
    assert_eq!(
        spec_diff(&want, &got, "spec"),
        ["spec.egress[1].ports[0].port: onramp applied 53, the API server has 5353"]
    );
}

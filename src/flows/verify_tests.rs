//! The read-backs' decisions on a simulated cluster whose API server, filesystem or operator
//! does not do what it was asked: a difference retries, then fails naming it; leftovers poll
//! until the deadline, then fail naming them.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::backends::exec::Transport;
use crate::backends::kubernetes::Kubernetes;
use crate::backends::kubernetes::api::K8sFuture;
use crate::backends::kubernetes::cleanup::Leftover;
use crate::backends::kubernetes::keys::{Applied, KeyState};
use crate::backends::kubernetes::tenant::Deleted;
use crate::backends::storage::{Limits, Located, Place, Quota, Snapshot, SnapshotName, Storage, StorageFuture};
use crate::domain::names::{ClusterName, Username};
use crate::domain::sshkey::PublicKey;
use crate::domain::tenants::{K8sNames, TenantRegistry};
use crate::dryrun::sim::{self, DryConfig, SimAuthentik, SimK8s};
use crate::engine::{StepCtx, Transition};
use crate::flows::Backends;
use crate::flows::verify;

/// The simulated API server, except that the policy reads back as `spec` and `left` stays.
struct Drift {
    sim: SimK8s,
    spec: Option<Value>,
    left: Vec<Leftover>,
}

fn ok<'a, T: Send + 'a>(v: T) -> K8sFuture<'a, T> {
    Box::pin(async move { Ok(v) })
}

impl Kubernetes for Drift {
    fn key_state<'a>(&'a self, n: &'a K8sNames, u: &'a Username, k: &'a PublicKey) -> K8sFuture<'a, KeyState> {
        self.sim.key_state(n, u, k)
    }
    fn put_key<'a>(&'a self, n: &'a K8sNames, u: &'a Username, k: &'a PublicKey) -> K8sFuture<'a, Applied> {
        self.sim.put_key(n, u, k)
    }
    fn remove_key<'a>(&'a self, n: &'a K8sNames, u: &'a Username) -> K8sFuture<'a, Applied> {
        self.sim.remove_key(n, u)
    }
    fn apply_network_policy<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, ()> {
        ok(())
    }
    fn read_network_policy<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Option<Value>> {
        ok(self.spec.clone())
    }
    fn remove_node_labels<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Vec<String>> {
        ok(vec![])
    }
    fn restart_login<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, ()> {
        ok(())
    }
    fn delete_slurm_cluster<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        ok(Deleted::Deleted)
    }
    fn delete_reservation<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        ok(Deleted::Deleted)
    }
    fn cluster_leftovers<'a>(&'a self, _: &'a K8sNames) -> K8sFuture<'a, Vec<Leftover>> {
        ok(self.left.clone())
    }
    fn slurmctld(&self) -> Arc<dyn Transport> {
        self.sim.slurmctld()
    }
    fn login(&self, n: &K8sNames) -> Arc<dyn Transport> {
        self.sim.login(n)
    }
}

/// A filesystem that keeps 1 TB hard / 900 GB soft whatever it is given.
struct Stubborn;

impl Storage for Stubborn {
    fn set_quota<'a>(&'a self, _: &'a Place, _: Quota) -> StorageFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }
    fn snapshot<'a>(&'a self, _: &'a Place, _: &'a SnapshotName) -> StorageFuture<'a, Snapshot> {
        Box::pin(async { Ok(Snapshot::Created) })
    }
    fn quota<'a>(&'a self, _: &'a Place) -> StorageFuture<'a, Option<Limits>> {
        let l = Limits { hard_bytes: Some(1_000_000_000_000), soft_bytes: Some(900_000_000_000), unit: 1 };
        Box::pin(async move { Ok(Some(l)) })
    }
    fn locate(&self, _: &Place) -> Located {
        Located { path: "/tenant/foo/scratch".into(), from: "registry" }
    }
}

fn backends(spec: Option<Value>, left: Vec<Leftover>) -> Arc<Backends> {
    let cfg = DryConfig {
        cluster: ClusterName::parse("production").unwrap(),
        k8s: Default::default(),
        storage: Default::default(),
        timings: crate::flows::Timings { cleanup_deadline: Duration::from_secs(60), ..Default::default() },
        archive_dir: crate::backends::slurm::HostPath::parse("/var/spool/slurm/archive").unwrap(),
        login_address: "login.{tenant}.example".into(),
        notify: false,
        batch_window: Duration::ZERO,
    };
    let reg = "tenants: [{ name: foo, group: g, quotas: { scratch: { path: /tenant/foo/scratch, soft: 45TB, hard: 50TB } } }]";
    let tenants = Arc::new(TenantRegistry::parse(reg, "t").unwrap());
    let world = sim::World::new(&cfg.cluster, cfg.k8s.clone());
    let log = Default::default();
    let b = sim::backends(&cfg, &world, Arc::new(SimAuthentik::new(None, vec![])), tenants, &log).unwrap();
    let k8s = Arc::new(Drift { sim: SimK8s(world), spec, left });
    let (slurm, s, ak, t) = (b.slurm.clone(), b.k8s_settings.clone(), b.authentik.clone(), b.tenants.clone());
    let (timings, dir) = (b.timings.clone(), b.archive_dir.clone());
    Backends::new(slurm, k8s, s, Arc::new(Stubborn), None, ak, t, timings, dir, b.login_address.clone())
}

fn ctx(attempt: u32, poll_deadline: Option<time::OffsetDateTime>) -> StepCtx {
    let input = json!({ "tenant": "foo" });
    StepCtx {
        attempt,
        poll_deadline,
        ..StepCtx::detached("tenant.onboard", "foo/tenant", input, Default::default(), "network_policy", 1)
    }
}

fn run(r: crate::flows::StepResult) -> Transition {
    crate::flows::finish(r)
}

#[tokio::test]
async fn a_policy_that_reads_back_otherwise_retries_then_fails_with_the_difference() {
    let k = |b: &Backends| b.tenants.tenant("foo").unwrap().kubernetes.clone();
    let want = crate::backends::kubernetes::tenant::network_policy(&k(&backends(None, vec![])), "slurm-control");
    let b = backends(Some(want["spec"].clone()), vec![]);
    assert!(matches!(run(verify::policy(&b, &k(&b), &ctx(1, None)).await), Transition::Done(_)));
    let mut changed = want["spec"].clone();
    changed["policyTypes"] = json!(["Ingress"]);
    let b = backends(Some(changed), vec![]);
    assert!(matches!(run(verify::policy(&b, &k(&b), &ctx(1, None)).await), Transition::Retry(_)));
    let Transition::Fail(e) = run(verify::policy(&b, &k(&b), &ctx(3, None)).await) else { panic!() };
    assert!(
        e.contains("spec.policyTypes: onramp applied [\"Ingress\",\"Egress\"], the API server has [\"Ingress\"]"),
        "{e}"
    );
    let b = backends(None, vec![]);
    let Transition::Fail(e) = run(verify::policy(&b, &k(&b), &ctx(3, None)).await) else { panic!() };
    assert!(e.contains("has no such NetworkPolicy"), "{e}");
}

#[tokio::test]
async fn a_quota_the_filesystem_keeps_otherwise_fails_with_hard_and_soft() {
    let b = backends(None, vec![]);
    let t = b.tenants.tenant("foo").unwrap().clone();
    let q = t.quotas.scratch.clone().unwrap();
    let place = verify::scratch_place(&t);
    assert_eq!(place.registry_path.as_deref(), Some("/tenant/foo/scratch"));
    assert!(matches!(run(verify::quota(&b, &place, &q, "scratch", &ctx(2, None)).await), Transition::Retry(_)));
    let Transition::Fail(e) = run(verify::quota(&b, &place, &q, "scratch", &ctx(3, None)).await) else { panic!() };
    assert_eq!(
        e,
        "the scratch quota on /tenant/foo/scratch does not read back as set: hard: set 50TB (50000000000000 bytes), \
         read back 1000000000000 bytes; soft: set 45TB (45000000000000 bytes), read back 900000000000 bytes"
    );
}

#[tokio::test]
async fn leftovers_are_polled_for_then_named_past_the_deadline() {
    let left = vec![Leftover { kind: "NodeSet".into(), name: "gpu".into() }];
    let b = backends(None, left);
    let k = b.tenants.tenant("foo").unwrap().kubernetes.clone();
    let t = run(verify::cluster_gone(&b, &k, &ctx(1, None)).await);
    assert_eq!(t, Transition::Poll { every: b.timings.cleanup_poll, for_at_most: Duration::from_secs(60) });
    let later = time::OffsetDateTime::now_utc() + time::Duration::minutes(1);
    assert!(matches!(run(verify::cluster_gone(&b, &k, &ctx(1, Some(later))).await), Transition::Poll { .. }));
    let past = time::OffsetDateTime::now_utc() - time::Duration::seconds(1);
    let Transition::Fail(e) = run(verify::cluster_gone(&b, &k, &ctx(1, Some(past))).await) else { panic!() };
    assert!(
        e.starts_with("SlurmCluster tenant-foo/cluster-tenant-foo is deleted but after 60s")
            && e.contains("NodeSet/gpu"),
        "{e}"
    );
    let b = backends(None, vec![]);
    let Transition::Done(out) = run(verify::cluster_gone(&b, &k, &ctx(1, Some(later))).await) else { panic!() };
    assert_eq!((out["polled"].clone(), out["slurm_cluster"].clone()), (json!(true), json!("Deleted")));
}

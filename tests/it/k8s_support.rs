//! Shared set-up for the Kubernetes tests: a fake API server with a slurmctld Deployment and a
//! tenant login pod, and a client pointed at it.

use std::time::Duration;

use onramp::backends::kubernetes::{K8s, K8sSettings};
use onramp::domain::tenants::{K8sNames, TenantRegistry};
use serde_json::json;

use onramp_fakes::k8s::FakeK8s;

/// The namespace of tenant `foo` (the runbook's `tenant-<name>`).
pub const TENANT: &str = "tenant-foo";

/// Tenant `foo`'s names as the registry resolves them by default (the runbook's).
pub fn tenant() -> K8sNames {
    let r = TenantRegistry::parse("tenants: [{ name: foo, group: tenant-foo-users }]", "test").unwrap();
    r.tenants[0].kubernetes.clone()
}

pub async fn cluster() -> (FakeK8s, K8s) {
    let fake = FakeK8s::start().await;
    let app = json!({"app": "slurmctld"});
    fake.deployment("slurm-control", "slurmctld", app.clone());
    fake.pod("slurm-control", "slurmctld-0-old", app.clone(), false);
    fake.pod("slurm-control", "slurmctld-1", app, true);
    fake.pod("slurm-control", "unrelated", json!({"app": "other"}), true);
    fake.pod(TENANT, "login-0", json!({"app": "login"}), true);
    fake.deployment(TENANT, "login", json!({"app": "login"}));
    let k8s = client(&fake, |_| {});
    (fake, k8s)
}

/// A client for `fake` with settings changed by `f`.
pub fn client(fake: &FakeK8s, f: impl FnOnce(&mut K8sSettings)) -> K8s {
    let mut s = K8sSettings { k8s_timeout: Duration::from_millis(1500), ..Default::default() };
    f(&mut s);
    K8s::for_url(&fake.url, s).unwrap()
}

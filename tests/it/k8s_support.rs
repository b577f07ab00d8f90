//! Shared set-up for the Kubernetes tests: a fake API server with a slurmctld Deployment and a
//! tenant login pod, and a client pointed at it.

use std::time::Duration;

use onramp::backends::kubernetes::{K8s, K8sSettings};
use onramp::domain::names::TenantName;
use serde_json::json;

use onramp_fakes::k8s::FakeK8s;

pub const TENANT: &str = "tenant-foo";

pub fn tenant() -> TenantName {
    TenantName::parse(TENANT).unwrap()
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

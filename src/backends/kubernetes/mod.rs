//! Kubernetes: the calls the runbook makes with `kubectl`, through the `kube` client.
//! - [`keys`]: the per-tenant key Secret (read; optionally written with server-side apply);
//! - [`exec`]: the exec transport (argv in a pod, or a Ready pod of a Deployment);
//! - [`login`]: `$HOME`, key projection and the smoke test on the login pod;
//! - [`tenant`]: NetworkPolicy, node labels, custom resources, rollout restart;
//! - [`cleanup`]: what is left of a deleted SlurmCluster (owner references).
//!
//! Every call is bounded by a timeout and its errors name the call ([`K8sError`]).

pub mod api;
pub mod cleanup;
pub mod error;
pub mod exec;
mod key_group;
pub mod keys;
pub mod login;
pub mod settings;
pub mod tenant;

use std::future::Future;
use std::time::Duration;

pub use api::Kubernetes;
pub use error::{Call, K8sError};
pub use settings::K8sSettings;

/// A client for one cluster, with the settings that name things in it.
#[derive(Clone)]
pub struct K8s {
    client: kube::Client,
    settings: K8sSettings,
    /// The writes to each key Secret, grouped in this process (see [`keys`]).
    key_writes: key_group::Writers,
}

impl K8s {
    /// Connects with a kubeconfig (`--kubeconfig`), or the in-cluster service account, or the
    /// default kubeconfig, in that order.
    pub async fn connect(settings: K8sSettings) -> Result<Self, K8sError> {
        let mut config = match &settings.kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| K8sError::Config(format!("kubeconfig {}: {e}", path.display())))?;
                let opts =
                    kube::config::KubeConfigOptions { context: settings.k8s_context.clone(), ..Default::default() };
                kube::Config::from_custom_kubeconfig(kc, &opts)
                    .await
                    .map_err(|e| K8sError::Config(format!("kubeconfig {}: {e}", path.display())))?
            }
            None => kube::Config::infer().await.map_err(|e| K8sError::Config(e.to_string()))?,
        };
        Self::tune(&mut config);
        Self::with_config(config, settings)
    }

    /// Talks to the API server at `url` without credentials (tests and `kubectl proxy`).
    pub fn for_url(url: &str, settings: K8sSettings) -> Result<Self, K8sError> {
        let uri = url.parse().map_err(|e| K8sError::Config(format!("API server URL {url:?}: {e}")))?;
        let mut config = kube::Config::new(uri);
        Self::tune(&mut config);
        Self::with_config(config, settings)
    }

    fn tune(config: &mut kube::Config) {
        // Retries belong to the job engine (policy per step), not hidden inside the client.
        config.default_retry = false;
        config.connect_timeout = Some(Duration::from_secs(10));
    }

    fn with_config(config: kube::Config, settings: K8sSettings) -> Result<Self, K8sError> {
        let client = kube::Client::try_from(config).map_err(|e| K8sError::Config(e.to_string()))?;
        Ok(Self { client, settings, key_writes: Default::default() })
    }

    pub fn settings(&self) -> &K8sSettings {
        &self.settings
    }

    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Runs one API call under the request timeout, classifying its error.
    pub(crate) async fn call<T>(
        &self,
        call: Call,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, K8sError> {
        let after = self.settings.k8s_timeout;
        match tokio::time::timeout(after, fut).await {
            Err(_) => Err(K8sError::Timeout { call: Box::new(call), after }),
            Ok(r) => r.map_err(|e| K8sError::from_kube(call, e)),
        }
    }
}

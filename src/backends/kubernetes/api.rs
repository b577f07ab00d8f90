//! The Kubernetes operations flows use, as one trait, so that a flow can hold
//! `Arc<dyn Kubernetes>` and a plan or dry run can stand in for the real client. [`K8s`] is the
//! one real implementation; tests point it at the fake API server in `tests/`. Per-tenant calls
//! take the tenant's names as the registry resolved them ([`K8sNames`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use super::cleanup::Leftover;
use super::exec::PodExec;
use super::keys::{Applied, KeyState};
use super::tenant::Deleted;
use super::{K8s, K8sError};
use crate::backends::exec::Transport;
use crate::domain::names::Username;
use crate::domain::sshkey::PublicKey;
use crate::domain::tenants::K8sNames;

pub type K8sFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, K8sError>> + Send + 'a>>;

pub trait Kubernetes: Send + Sync {
    /// Whether the tenant's key Secret holds the user's expected key.
    fn key_state<'a>(&'a self, names: &'a K8sNames, user: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, KeyState>;
    /// Writes the user's key into the Secret (only with `--manage-keys`).
    fn put_key<'a>(&'a self, names: &'a K8sNames, user: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, Applied>;
    /// Removes the user's key from the Secret (only with `--manage-keys`).
    fn remove_key<'a>(&'a self, names: &'a K8sNames, user: &'a Username) -> K8sFuture<'a, Applied>;
    fn apply_network_policy<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, ()>;
    /// The NetworkPolicy's `spec` as the API server has it (`None`: none).
    fn read_network_policy<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Option<serde_json::Value>>;
    fn remove_node_labels<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Vec<String>>;
    fn restart_login<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, ()>;
    fn delete_slurm_cluster<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Deleted>;
    fn delete_reservation<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Deleted>;
    /// What is left of the tenant's deleted SlurmCluster (NodeSets, StatefulSets, pods, Secrets).
    fn cluster_leftovers<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Vec<Leftover>>;
    /// Runs commands in a Ready pod of the slurmctld Deployment.
    fn slurmctld(&self) -> Arc<dyn Transport>;
    /// Runs commands in the tenant's login pod.
    fn login(&self, names: &K8sNames) -> Arc<dyn Transport>;
}

impl Kubernetes for K8s {
    fn key_state<'a>(&'a self, names: &'a K8sNames, user: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, KeyState> {
        Box::pin(K8s::key_state(self, names, user, key))
    }
    fn put_key<'a>(&'a self, names: &'a K8sNames, user: &'a Username, key: &'a PublicKey) -> K8sFuture<'a, Applied> {
        Box::pin(K8s::put_key(self, names, user, key))
    }
    fn remove_key<'a>(&'a self, names: &'a K8sNames, user: &'a Username) -> K8sFuture<'a, Applied> {
        Box::pin(K8s::remove_key(self, names, user))
    }
    fn apply_network_policy<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, ()> {
        Box::pin(K8s::apply_network_policy(self, names))
    }
    fn read_network_policy<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Option<serde_json::Value>> {
        Box::pin(K8s::read_network_policy(self, names))
    }
    fn remove_node_labels<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Vec<String>> {
        Box::pin(K8s::remove_node_labels(self, names))
    }
    fn restart_login<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, ()> {
        Box::pin(K8s::restart_login(self, names))
    }
    fn delete_slurm_cluster<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        Box::pin(K8s::delete_slurm_cluster(self, names))
    }
    fn delete_reservation<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Deleted> {
        Box::pin(K8s::delete_reservation(self, names))
    }
    fn cluster_leftovers<'a>(&'a self, names: &'a K8sNames) -> K8sFuture<'a, Vec<Leftover>> {
        Box::pin(K8s::cluster_leftovers(self, names))
    }
    fn slurmctld(&self) -> Arc<dyn Transport> {
        Arc::new(PodExec::slurmctld(self))
    }
    fn login(&self, names: &K8sNames) -> Arc<dyn Transport> {
        Arc::new(PodExec::login(self, names))
    }
}

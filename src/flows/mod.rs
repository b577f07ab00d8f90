//! Flows: plain enums of steps on the engine. They know nothing of SQL.

pub mod backends;
pub mod reconcile;
pub mod selftest;
pub mod specs;
pub mod user_offboard;
pub mod user_onboard;

use std::sync::Arc;

pub use backends::{Backends, Timings};

use crate::engine::Registry;

/// Every flow this build of onramp runs.
pub fn registry() -> Registry {
    Registry::new().with(selftest::SelfTest)
}

/// Adds the user and tenant flows, acting on `backends`.
pub fn with_backends(registry: Registry, backends: Arc<Backends>) -> Registry {
    registry.with(user_onboard::UserOnboard(backends.clone())).with(user_offboard::UserOffboard(backends))
}

/// Adds the reconcile flows (they need Authentik, the tenant registry and the cluster).
pub fn with_reconcile(registry: Registry, r: Arc<crate::reconcile::Reconciler>) -> Registry {
    registry
        .with(reconcile::ReconcileUser(r.clone()))
        .with(reconcile::ReconcileTenants { reconciler: r.clone(), full: false })
        .with(reconcile::ReconcileTenants { reconciler: r.clone(), full: true })
        .with(reconcile::ReconcileHold(r))
}

//! Flows: plain enums of steps on the engine. They know nothing of SQL.

pub mod reconcile;
pub mod selftest;

use std::sync::Arc;

use crate::engine::Registry;

/// Every flow this build of onramp runs.
pub fn registry() -> Registry {
    Registry::new().with(selftest::SelfTest)
}

/// Adds the reconcile flows (they need Authentik, the tenant registry and the cluster).
pub fn with_reconcile(registry: Registry, r: Arc<crate::reconcile::Reconciler>) -> Registry {
    registry
        .with(reconcile::ReconcileUser(r.clone()))
        .with(reconcile::ReconcileTenants {
            reconciler: r.clone(),
            full: false,
        })
        .with(reconcile::ReconcileTenants {
            reconciler: r.clone(),
            full: true,
        })
        .with(reconcile::ReconcileHold(r))
}

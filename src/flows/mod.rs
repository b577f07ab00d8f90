//! Flows: plain enums of steps on the engine. They know nothing of SQL.

/// `tri!(r)`: the value of `Ok`, or return the `Err`'s `Transition` from the step.
macro_rules! tri {
    ($e:expr) => {
        match $e {
            Ok(v) => v,
            Err(t) => return t,
        }
    };
}

/// A flow's steps as a plain enum with their names: `steps! { pub enum Step { Block = "block", … } }`
/// gives `Step::ALL` (in order, for `match Step::ALL[step]`) and `Step::NAMES` (the flow's `steps()`).
macro_rules! steps {
    ($(#[$m:meta])* $vis:vis enum $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name { $($variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub const NAMES: &'static [&'static str] = &[$($text),+];
        }
    };
}
pub(crate) use steps;

pub mod backends;
pub mod reconcile;
pub mod selftest;
pub mod settings;
pub mod specs;
pub mod tenant;
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
    registry
        .with(user_onboard::UserOnboard(backends.clone()))
        .with(user_offboard::UserOffboard(backends.clone()))
        .with(tenant::TenantOnboard(backends.clone()))
        .with(tenant::TenantOffboard(backends))
}

/// Registers the user flows' kinds without backends, for a process that only enqueues (the API
/// role): its jobs are run by worker processes, which have the backends.
pub fn with_kinds_only(registry: Registry) -> Registry {
    registry
        .with(KindOnly(crate::flows::reconcile::USER_ONBOARD, user_onboard::STEPS))
        .with(KindOnly(crate::flows::reconcile::USER_OFFBOARD, user_offboard::STEPS))
        .with(KindOnly(tenant::TENANT_ONBOARD, tenant::ONBOARD_STEPS))
        .with(KindOnly(tenant::TENANT_OFFBOARD, tenant::OFFBOARD_STEPS))
}

struct KindOnly(&'static str, &'static [&'static str]);

impl crate::engine::Flow for KindOnly {
    fn kind(&self) -> &'static str {
        self.0
    }
    fn steps(&self) -> &'static [&'static str] {
        self.1
    }
    fn run<'a>(&'a self, _: usize, _: &'a crate::engine::StepCtx) -> crate::engine::StepFuture<'a> {
        Box::pin(async { crate::engine::Transition::Retry("this process has no backends for this flow".into()) })
    }
}

/// Adds the reconcile flows (they need Authentik, the tenant registry and the cluster).
pub fn with_reconcile(registry: Registry, r: Arc<crate::flows::reconcile::Reconciler>) -> Registry {
    registry
        .with(reconcile::ReconcileUser(r.clone()))
        .with(reconcile::ReconcileTenants { reconciler: r.clone(), full: false })
        .with(reconcile::ReconcileTenants { reconciler: r.clone(), full: true })
        .with(reconcile::ReconcileHold(r))
}

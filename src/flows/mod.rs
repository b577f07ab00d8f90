//! Flows: plain enums of steps on the engine. They know nothing of SQL.
//!
//! A step function returns a [`StepResult`]: `Ok` with the step's transition, or `Err` with the
//! transition that ends this run early (a backend error through [`StepError::step`], a bad input,
//! a refusal), so steps use plain `?`. [`finish`] turns either into the transition.

/// A flow's steps as a plain enum with their names: `steps! { pub enum Step { Block = "block", … } }`
/// gives `Step::ALL` (in order, for `match Step::ALL[step]`), `Step::NAMES` (the flow's `steps()`)
/// and `step.name()` (the key of its output).
macro_rules! steps {
    ($(#[$m:meta])* $vis:vis enum $name:ident { $($variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        $vis enum $name { $($variant),+ }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            pub const NAMES: &'static [&'static str] = &[$($text),+];
            /// The step's name in the job history (its output's key).
            pub const fn name(self) -> &'static str {
                Self::NAMES[self as usize]
            }
        }
    };
}
pub(crate) use steps;

pub mod archive;
pub mod backends;
pub mod drain;
pub mod membership;
pub mod reconcile;
pub mod selftest;
pub mod settings;
pub mod specs;
pub mod tenant;
pub mod tenant_snapshots;
pub mod user_offboard;
pub mod user_onboard;
pub mod verify;
mod welcome;

use std::sync::Arc;

pub use backends::{Backends, StepError, Timings};

use crate::engine::{Registry, StepCtx, Transition};

/// What a step function returns: `Err` ends the run early with its transition.
pub type StepResult = Result<Transition, Transition>;

/// The transition of a step's run, whichever way it ended.
pub fn finish(r: StepResult) -> Transition {
    r.unwrap_or_else(|t| t)
}

/// The typed output of an earlier step of this job (named by its step enum); a missing or
/// unreadable one fails the step.
pub(crate) fn earlier<T: serde::de::DeserializeOwned>(ctx: &StepCtx, step: &'static str) -> Result<T, Transition> {
    ctx.output_of(step).ok_or_else(|| Transition::Fail(format!("output of step {step} missing or unreadable")))
}

/// Every flow this build of onramp runs without backends.
/// A user flow's job: subject `<tenant>/<user>`, one unfinished job per (kind, account, user).
pub(crate) fn user_job(
    kind: &'static str,
    (tenant, account, username): (&str, &str, &str),
    input: &impl serde::Serialize,
    actor: crate::engine::Actor,
) -> crate::engine::NewJob {
    crate::engine::NewJob::typed(kind, &format!("{tenant}/{username}"), input, actor)
        .dedupe(format!("{kind}:{account}/{username}"))
}

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

/// Declares every kind of this build (the user, tenant and reconcile flows), for a process that
/// only enqueues them (the API role, the command line): workers with the backends run them.
pub fn declare_all(registry: Registry) -> Registry {
    registry
        .declare(user_onboard::USER_ONBOARD, user_onboard::Step::NAMES)
        .declare(user_offboard::USER_OFFBOARD, user_offboard::Step::NAMES)
        .declare(tenant::TENANT_ONBOARD, tenant::OnboardStep::NAMES)
        .declare(tenant::TENANT_OFFBOARD, tenant::OffboardStep::NAMES)
        .declare(reconcile::RECONCILE_USER, reconcile::RECONCILE_STEPS)
        .declare(reconcile::RECONCILE_TENANT, reconcile::RECONCILE_STEPS)
        .declare(reconcile::RECONCILE_FULL, reconcile::RECONCILE_STEPS)
        .declare(reconcile::RECONCILE_HOLD, reconcile::hold::Step::NAMES)
}

/// Adds the reconcile flows (they need Authentik, the tenant registry and the cluster).
pub fn with_reconcile(registry: Registry, r: Arc<reconcile::Reconciler>) -> Registry {
    registry
        .with(reconcile::user::ReconcileUser(r.clone()))
        .with(reconcile::tenants::ReconcileTenants { reconciler: r.clone(), full: false })
        .with(reconcile::tenants::ReconcileTenants { reconciler: r.clone(), full: true })
        // releasing held offboardings is irreversible: a second person approves it
        .with(crate::engine::FourEyes(reconcile::hold::ReconcileHold(r)))
}

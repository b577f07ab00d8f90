//! Level-triggered reconcile: Authentik (desired) against the cluster's associations (actual).
//! A webhook is only a hint that something may differ; these jobs re-read both sides and enqueue
//! onboarding or offboarding (idempotent by dedupe key), or nothing, and record why.

pub mod cluster;
pub mod flow;
pub mod plan;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::json;
use time::OffsetDateTime;

use crate::backends::authentik::Authentik;
use crate::domain::tenants::TenantRegistry;
use crate::engine::{Actor, Engine, NewJob};
use crate::intake::event::Target;

pub use cluster::{AssociationSource, ClusterError, SacctmgrAssociations};
pub use flow::{ReconcileHold, ReconcileTenants, ReconcileUser, job_for};
pub use plan::Brake;

/// Reconcile one user (`{"pk": 42}` or `{"username": "alice"}`).
pub const RECONCILE_USER: &str = "reconcile.user";
/// Reconcile one or more tenants (`{"tenants": ["foo"]}`), with the safety brake.
pub const RECONCILE_TENANT: &str = "reconcile.tenant";
/// Reconcile every tenant of the registry (periodic, at start, `onramp reconcile`).
pub const RECONCILE_FULL: &str = "reconcile.full";
/// Offboardings held by the safety brake, waiting for a person's approval.
pub const RECONCILE_HOLD: &str = "reconcile.hold";

/// Implemented by the user onboarding flow (flows issue); enqueued here by kind name.
pub const USER_ONBOARD: &str = "user.onboard";
/// Implemented by the user offboarding flow (flows issue); enqueued here by kind name.
pub const USER_OFFBOARD: &str = "user.offboard";

/// What the reconcile flows need. The engine is attached once it exists (it holds the flows).
pub struct Reconciler {
    pub authentik: Arc<dyn Authentik>,
    pub tenants: Arc<TenantRegistry>,
    pub cluster: Arc<dyn AssociationSource>,
    pub brake: Brake,
    engine: OnceLock<Engine>,
}

impl Reconciler {
    pub fn new(
        authentik: Arc<dyn Authentik>,
        tenants: Arc<TenantRegistry>,
        cluster: Arc<dyn AssociationSource>,
        brake: Brake,
    ) -> Arc<Self> {
        Arc::new(Self { authentik, tenants, cluster, brake, engine: OnceLock::new() })
    }

    /// Gives the flows the engine they enqueue with. Call once, right after `Engine::new`.
    pub fn attach(&self, engine: &Engine) {
        let _ = self.engine.set(engine.clone());
    }

    pub fn engine(&self) -> Option<&Engine> {
        self.engine.get()
    }
}

/// The job that reconciles one user.
pub fn user_job(pk: i64, actor: Actor, cause: &str) -> NewJob {
    NewJob::new(RECONCILE_USER, &format!("reconcile/user/{pk}"), json!({ "pk": pk, "cause": cause }), actor)
        .dedupe(format!("{RECONCILE_USER}:{pk}"))
}

/// The job that reconciles some tenants.
pub fn tenant_job(tenant: &str, actor: Actor, cause: &str) -> NewJob {
    NewJob::new(
        RECONCILE_TENANT,
        &format!("reconcile/tenant/{tenant}"),
        json!({ "tenants": [tenant], "cause": cause }),
        actor,
    )
    .dedupe(format!("{RECONCILE_TENANT}:{tenant}"))
}

/// The job that reconciles everything.
pub fn full_job(actor: Actor, cause: &str) -> NewJob {
    NewJob::new(RECONCILE_FULL, "reconcile/full", json!({ "cause": cause }), actor).dedupe(RECONCILE_FULL)
}

/// The reconcile jobs a delivery's targets call for, due after `settle` (Authentik logs some
/// events before the change is visible, and a burst of events collapses into one job).
pub fn jobs_for_targets(targets: &[Target], tenants: &TenantRegistry, delivery: &str, settle: Duration) -> Vec<NewJob> {
    let actor = Actor::webhook(delivery);
    let cause = format!("webhook:{delivery}");
    let at = OffsetDateTime::now_utc() + settle;
    let mut jobs = vec![];
    for t in targets {
        match t {
            Target::User { pk } => jobs.push(user_job(*pk, actor.clone(), &cause)),
            Target::Group { name } => jobs.extend(
                tenants.tenants_of_group(name).into_iter().map(|t| tenant_job(t.name.as_str(), actor.clone(), &cause)),
            ),
            Target::Everything => jobs.push(full_job(actor.clone(), &cause)),
        }
    }
    jobs.into_iter().map(|j| if settle.is_zero() { j } else { j.at(at) }).collect()
}

//! Level-triggered reconcile: Authentik (desired) against the cluster's associations (actual,
//! read through the [`Slurm`] backend). A webhook is only a hint that something may differ; these
//! jobs re-read both sides and enqueue onboarding or offboarding (idempotent by dedupe key), or
//! nothing, and record why.

pub mod brake;
mod enqueue;
pub mod hold;
pub mod plan;
pub mod tenants;
pub mod user;

use std::collections::BTreeMap;
use std::sync::Arc;

use time::OffsetDateTime;

pub use enqueue::job_for;
pub use plan::{Brake, Drifted, OFFBOARD_BUDGET};

use crate::backends::authentik::Authentik;
use crate::backends::slurm::{Slurm, UserLimits, limits_differ};
use crate::domain::names::{SlurmAccount, Username};
use crate::domain::tenants::TenantRegistry;
use crate::engine::{Actor, NewJob};
use crate::flows::specs;

/// Reconcile one user (`{"pk": 42}` or `{"username": "alice"}`).
pub const RECONCILE_USER: &str = "reconcile.user";
/// Reconcile one or more tenants (`{"tenants": ["foo"]}`), with the safety brake.
pub const RECONCILE_TENANT: &str = "reconcile.tenant";
/// Reconcile every tenant of the registry (periodic, at start, `onramp reconcile`).
pub const RECONCILE_FULL: &str = "reconcile.full";
/// Offboardings held by the safety brake (one job for all of them), waiting for a person's approval.
pub const RECONCILE_HOLD: &str = "reconcile.hold";
/// The one step of `reconcile.user`, `reconcile.tenant` and `reconcile.full`.
pub const RECONCILE_STEPS: &[&str] = &["reconcile"];

/// What a change in Authentik points at: whom to reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// One user, by Authentik primary key.
    User { pk: i64 },
    /// Every member (and former member) of a group, by name.
    Group { name: String },
    /// Cannot tell: reconcile everything.
    Everything,
}

impl Subject {
    /// The form a stored delivery keeps (its `targets`): `user:42`, `group:<name>`, `everything`.
    pub fn to_target(&self) -> String {
        match self {
            Subject::User { pk } => format!("user:{pk}"),
            Subject::Group { name } => format!("group:{name}"),
            Subject::Everything => "everything".into(),
        }
    }

    /// Reads [`Subject::to_target`]'s form back; None for anything else.
    pub fn from_target(s: &str) -> Option<Self> {
        match s.split_once(':') {
            Some(("user", pk)) => pk.parse().ok().map(|pk| Subject::User { pk }),
            Some(("group", name)) if !name.is_empty() => Some(Subject::Group { name: name.into() }),
            None if s == "everything" => Some(Subject::Everything),
            _ => None,
        }
    }
}

/// What the reconcile flows need: desired state (Authentik, the tenant registry), actual state
/// (the Slurm backend) and the safety brake. Other jobs are enqueued through each step's context.
pub struct Reconciler {
    pub authentik: Arc<dyn Authentik>,
    pub tenants: Arc<TenantRegistry>,
    pub slurm: Arc<dyn Slurm>,
    pub brake: Brake,
}

impl Reconciler {
    pub fn new(
        authentik: Arc<dyn Authentik>,
        tenants: Arc<TenantRegistry>,
        slurm: Arc<dyn Slurm>,
        brake: Brake,
    ) -> Arc<Self> {
        Arc::new(Self { authentik, tenants, slurm, brake })
    }

    /// Every (account, user) association under these accounts, in one bulk read. Users whose
    /// name onramp cannot handle are skipped (and logged).
    pub async fn actual(&self, accounts: &[SlurmAccount]) -> Result<Vec<(SlurmAccount, Username)>, String> {
        Ok(self.actual_with_limits(accounts).await?.0)
    }

    /// [`Self::actual`], and those of its associations (partition-less, under a tenant's account)
    /// whose limits differ from what the tenant gives its users, from the same read.
    pub async fn actual_with_limits(
        &self,
        accounts: &[SlurmAccount],
    ) -> Result<(Vec<(SlurmAccount, Username)>, Drifted), String> {
        let assocs = self.slurm.associations(accounts).await.map_err(|e| format!("cluster read failed: {e}"))?;
        let mut want: BTreeMap<SlurmAccount, UserLimits> = BTreeMap::new();
        for t in &self.tenants.tenants {
            match specs::user_limits(t) {
                Ok(l) => want.extend(t.accounts().into_iter().map(|a| (a, l.clone()))),
                Err(e) => tracing::warn!(error = %e, "cannot tell whether the tenant's associations have its limits"),
            }
        }
        let (mut out, mut drifted) = (vec![], Drifted::new());
        for a in assocs.iter().filter(|a| !a.user.is_empty()) {
            let account = SlurmAccount::parse(&a.account).map_err(|e| format!("cluster read failed: {e}"))?;
            let user = match Username::parse(&a.user) {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!(error = %e, "skipping an association whose user name onramp cannot handle");
                    continue;
                }
            };
            if let Some(l) = want.get(&account).filter(|_| a.partition.is_empty()) {
                let differ = limits_differ(l, a);
                if !differ.is_empty() {
                    drifted.insert((account.clone(), user.clone()), differ);
                }
            }
            out.push((account, user));
        }
        Ok((out, drifted))
    }
}

/// `reconcile.user`'s input.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
pub struct UserInput {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pk: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    #[serde(default)]
    pub cause: String,
}

/// `reconcile.tenant`'s and `reconcile.full`'s input.
#[derive(Clone, Debug, Default, serde::Deserialize, serde::Serialize)]
pub struct TenantsInput {
    /// None: every tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
    #[serde(default)]
    pub cause: String,
}

/// The job that reconciles one user.
pub fn user_job(pk: i64, actor: Actor, cause: &str) -> NewJob {
    let input = UserInput { pk: Some(pk), username: None, cause: cause.into() };
    NewJob::typed(RECONCILE_USER, &format!("reconcile/user/{pk}"), &input, actor)
        .dedupe(format!("{RECONCILE_USER}:{pk}"))
}

/// The job that reconciles some tenants.
pub fn tenant_job(tenant: &str, actor: Actor, cause: &str) -> NewJob {
    let input = TenantsInput { tenants: Some(vec![tenant.into()]), cause: cause.into() };
    NewJob::typed(RECONCILE_TENANT, &format!("reconcile/tenant/{tenant}"), &input, actor)
        .dedupe(format!("{RECONCILE_TENANT}:{tenant}"))
}

/// The job that reconciles everything.
pub fn full_job(actor: Actor, cause: &str) -> NewJob {
    let input = TenantsInput { tenants: None, cause: cause.into() };
    NewJob::typed(RECONCILE_FULL, "reconcile/full", &input, actor).dedupe(RECONCILE_FULL)
}

/// The reconcile jobs a delivery's subjects call for, due at `due` (the delivery's arrival plus
/// a settle delay: Authentik logs some events before the change is visible, and a burst of events
/// collapses into one job); now when None.
pub fn jobs_for_subjects(
    subjects: &[Subject],
    tenants: &TenantRegistry,
    delivery: &str,
    due: Option<OffsetDateTime>,
) -> Vec<NewJob> {
    let actor = Actor::webhook(delivery);
    let cause = format!("webhook:{delivery}");
    let mut jobs = vec![];
    for s in subjects {
        match s {
            Subject::User { pk } => jobs.push(user_job(*pk, actor.clone(), &cause)),
            Subject::Group { name } => jobs.extend(
                tenants.tenants_of_group(name).into_iter().map(|t| tenant_job(t.name.as_str(), actor.clone(), &cause)),
            ),
            Subject::Everything => jobs.push(full_job(actor.clone(), &cause)),
        }
    }
    match due {
        Some(at) => jobs.into_iter().map(|j| j.at(at)).collect(),
        None => jobs,
    }
}

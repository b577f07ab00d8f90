//! Who belongs to a tenant, as far as a process without Slurm can tell (the API role): a member
//! now, per the tenant's groups in Authentik, or one before, per the job history (an onboarding
//! of theirs in the tenant that reached the association, or an offboarding the reconciler started from their association or
//! whose `block` step found one). The offboarding flow's first step checks the association in
//! Slurm itself, authoritatively.

use crate::backends::authentik::{Authentik, AuthentikError};
use crate::domain::names::Username;
use crate::domain::tenants::Tenant;
use crate::engine::{Engine, EngineError, Job, JobFilter};

use super::user_offboard::{self, USER_OFFBOARD};
use super::user_onboard::{self, USER_ONBOARD};

/// Whether Authentik has `user` in the tenant's group now (active or not). An unknown user, or
/// an answer that does not say which groups the user is in, is not a member.
pub async fn in_tenant_groups(ak: &dyn Authentik, t: &Tenant, user: &Username) -> Result<bool, AuthentikError> {
    match ak.user_by_username(user.as_str()).await {
        Ok(u) => Ok(u.knows_group_names() && !t.placement(&u.group_names()).is_empty()),
        Err(AuthentikError::NotFound(_)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Whether a job of the user's subject in the tenant shows they were in it.
pub fn shows_membership(j: &Job) -> bool {
    match j.kind.as_str() {
        // one that got as far as the association: they were a member then (an API caller's
        // onboarding of a name that is nobody's stops at resolve_user and proves nothing)
        USER_ONBOARD => {
            j.state.as_str() == "succeeded" || j.outputs.get(user_onboard::Step::SlurmAssociation.name()).is_some()
        }
        // the reconciler offboards from associations it read; an API caller's word is not proof
        USER_OFFBOARD => {
            !j.created_by.starts_with("api:") || j.outputs.get(user_offboard::Step::Block.name()).is_some()
        }
        _ => false,
    }
}

/// Whether the job history shows `user` in tenant `t`.
pub async fn in_history(engine: &Engine, t: &Tenant, user: &Username) -> Result<bool, EngineError> {
    let filter = JobFilter { subject: Some(format!("{}/{user}", t.name)), limit: 100, ..Default::default() };
    Ok(engine.list(&filter).await?.iter().any(shows_membership))
}

/// Whether `user` is or was in tenant `t`: Authentik's groups (when given), then the history.
pub async fn belongs(
    ak: Option<&dyn Authentik>,
    engine: &Engine,
    t: &Tenant,
    user: &Username,
) -> Result<bool, MembershipError> {
    if let Some(ak) = ak
        && in_tenant_groups(ak, t, user).await?
    {
        return Ok(true);
    }
    Ok(in_history(engine, t, user).await?)
}

/// Membership could not be read.
#[derive(Debug, thiserror::Error)]
pub enum MembershipError {
    #[error("{0}")]
    Authentik(#[from] AuthentikError),
    #[error("{0}")]
    Engine(#[from] EngineError),
}

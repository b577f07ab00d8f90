//! The tenant registry's entries as the Slurm backend's specs.

use crate::backends::slurm::{AccountLimits, AccountSpec, Fairshare, Limit, SlurmText, TenantSpec, Tres, UserLimits};
use crate::domain::tenants::Tenant;

/// The association limits every user of the tenant gets (the runbook's step 3): Fairshare=parent,
/// the tenant's QOS and MaxJobs, GrpJobs unset (which also lifts an offboarding block).
pub fn user_limits(t: &Tenant) -> Result<UserLimits, String> {
    let d = &t.user_defaults;
    let grp_tres_mins = match &d.grp_tres_mins {
        Some(s) => Some(Tres::parse(s).map_err(|e| format!("tenant {}: grp_tres_mins: {e:?}", t.name))?),
        None => None,
    };
    Ok(UserLimits {
        fairshare: Some(Fairshare::Parent),
        default_qos: d.default_qos.clone(),
        qos: (!d.qos.is_empty()).then(|| d.qos.clone()),
        max_jobs: Some(d.max_jobs.map_or(Limit::Unlimited, |n| Limit::At(u64::from(n)))),
        grp_jobs: Some(Limit::Unlimited),
        grp_tres_mins,
    })
}

fn text(s: &str) -> Result<SlurmText, String> {
    SlurmText::parse(s).map_err(|e| e.to_string())
}

/// The tenant account with its limits and its team sub-accounts.
pub fn tenant_spec(t: &Tenant) -> Result<TenantSpec, String> {
    let grp_tres = match &t.limits.grp_tres {
        Some(s) => Some(Tres::parse(s).map_err(|e| format!("tenant {}: grp_tres: {e:?}", t.name))?),
        None => None,
    };
    let description = t.description.clone().unwrap_or_else(|| format!("Tenant {}", t.name));
    let account = AccountSpec {
        name: t.account.clone(),
        parent: None,
        description: text(&description)?,
        organization: text(t.account.as_str())?,
        limits: AccountLimits {
            fairshare: t.limits.fairshare.map(Fairshare::Shares),
            grp_tres,
            grp_jobs: Some(t.limits.grp_jobs.map_or(Limit::Unlimited, |n| Limit::At(u64::from(n)))),
        },
    };
    let teams = t
        .teams
        .iter()
        .map(|m| {
            Ok(AccountSpec {
                name: m.account.clone(),
                parent: Some(t.account.clone()),
                description: text(&format!("{description} team {}", m.account))?,
                organization: text(t.account.as_str())?,
                limits: AccountLimits { fairshare: m.fairshare.map(Fairshare::Shares), grp_tres: None, grp_jobs: None },
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(TenantSpec { account, teams })
}

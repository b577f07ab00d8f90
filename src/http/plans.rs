//! /v1/plans/{flow}: what a flow would do for a tenant (and user), in order, with its waits,
//! made by running the flow's steps on the simulated cluster (see `crate::dryrun`). Nothing is
//! changed anywhere; Authentik is only read. A tenant-scoped token plans for its tenant only, and
//! for a user only when they are (per the tenant's Authentik groups) or were (per the job
//! history) in that tenant: anyone else is "not found", with nothing about them in the answer.

use axum::Json;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use serde::Deserialize;

use super::auth::Auth;
use super::extract::{Params, PathParam};
use super::{Problem, Route, Shared, route};
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::dryrun::plan::{Plan, PlanRequest, plan};
use crate::flows::membership;
use crate::http::access::Role;

pub fn routes() -> Vec<Route> {
    vec![route(Method::GET, "/v1/plans/{flow}", show)]
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanQuery {
    tenant: String,
    user: Option<String>,
    account: Option<String>,
    #[serde(default)]
    hard_cutoff: bool,
}

fn invalid(what: &str, e: impl ToString) -> Problem {
    Problem::unprocessable(format!("{what}: {}", e.to_string()))
}

async fn show(
    auth: Auth,
    State(s): State<Shared>,
    PathParam(flow): PathParam<String>,
    Params(q): Params<PlanQuery>,
) -> Result<Json<Plan>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let tenant = TenantName::parse(&q.tenant).map_err(|e| invalid("tenant", e))?;
    if !p.sees(tenant.as_str()) {
        let own = p.tenant.as_deref().unwrap_or_default();
        return Err(Problem::forbidden(format!("this token plans for tenant {own} only")));
    }
    let registry = s
        .tenants
        .clone()
        .ok_or_else(|| Problem::unavailable("this onramp has no tenant registry: set ONRAMP_TENANTS"))?;
    let planner = s.plans.clone().ok_or_else(|| {
        Problem::unavailable(
            "plans need the tenant registry and the Slurm, Kubernetes and storage settings of onramp serve",
        )
    })?;
    let user = q.user.as_deref().map(Username::parse).transpose().map_err(|e| invalid("user", e))?;
    if let Some(u) = &user {
        registry.identities.check_name(u.as_str()).map_err(|e| invalid("user", e))?;
    }
    // a scoped token plans for its tenant's users only: anyone else is not found, and nothing of
    // theirs (groups, e-mail) is read into the plan
    if let (Some(_), Some(u), Some(t)) = (&p.tenant, &user, registry.tenant(tenant.as_str())) {
        let ak = planner.authentik.as_deref();
        let known = membership::belongs(ak, &s.engine, t, u).await.map_err(|e| {
            tracing::warn!(error = %e, "plan: membership could not be read");
            Problem::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "Unavailable",
                "cannot check the user's membership right now (Authentik or the database did not answer); try again",
            )
        })?;
        if !known {
            return Err(Problem::not_found(format!("no user {u} in tenant {tenant}")));
        }
    }
    let req = PlanRequest {
        flow,
        tenant,
        user,
        account: q.account.as_deref().map(SlurmAccount::parse).transpose().map_err(|e| invalid("account", e))?,
        hard_cutoff: q.hard_cutoff,
    };
    let made = plan(&req, &planner.cfg, registry, planner.authentik.clone()).await;
    made.map(Json).map_err(|e| Problem::unprocessable(e.to_string()))
}

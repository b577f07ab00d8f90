//! /v1/plans/{flow}: what a flow would do for a tenant (and user), in order, with its waits,
//! made by running the flow's steps on the simulated cluster (see `crate::dryrun`). Nothing is
//! changed anywhere; Authentik is only read. A tenant-scoped token plans for its tenant only.

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use serde::Deserialize;

use super::auth::Auth;
use super::extract::{Params, PathParam};
use super::{AppState, Problem, Route, route};
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::dryrun::plan::{Plan, PlanRequest, plan};
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
    State(s): State<AppState>,
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
    let req = PlanRequest {
        flow,
        tenant,
        user: q.user.as_deref().map(Username::parse).transpose().map_err(|e| invalid("user", e))?,
        account: q.account.as_deref().map(SlurmAccount::parse).transpose().map_err(|e| invalid("account", e))?,
        hard_cutoff: q.hard_cutoff,
    };
    let made = plan(&req, &planner.cfg, registry, planner.authentik.clone()).await;
    made.map(Json).map_err(|e| Problem::unprocessable(e.to_string()))
}

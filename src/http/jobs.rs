//! /v1/jobs: list (keyset pages), one job with its attempts and audit trail, a live stream of
//! changes (`stream`), and the actions cancel, retry and approve. A tenant-scoped token sees its tenant only
//! (a registry tenant, never the reconciler's jobs): anything else is "not found". Approving a
//! four-eyes step (a hard cutoff, a tenant offboarding, a brake's release) is refused to the token
//! that started the job (403).

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Auth;
use super::extract::{OptBody, Params, PathParam};
use super::{AppState, Problem, Route, Shared, params, route};
use crate::engine::{Job, JobFilter, JobState};
use crate::http::access::{Principal, Role, UNSCOPED_KINDS};

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/whoami", whoami),
        route(Method::GET, "/v1/jobs", list),
        route(Method::GET, "/v1/jobs/{id}", show),
        route(Method::GET, "/v1/stream", super::stream::stream).long_lived(),
        route(Method::POST, "/v1/jobs/{id}/cancel", cancel),
        route(Method::POST, "/v1/jobs/{id}/retry", retry),
        route(Method::POST, "/v1/jobs/{id}/approve", approve),
    ]
}

async fn whoami(auth: Auth) -> Json<Value> {
    let p = auth.0;
    Json(json!({ "token": p.token_name, "role": p.role, "tenant": p.tenant }))
}

/// As sent: each parameter is read below, with a message naming it when it does not fit.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    kind: Option<String>,
    subject: Option<String>,
    tenant: Option<String>,
    user: Option<String>,
    created_since: Option<String>,
    /// Keyset cursor: the `next` of the previous page.
    before: Option<String>,
    limit: Option<String>,
}

async fn list(auth: Auth, State(s): State<Shared>, Params(q): Params<ListQuery>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let states: Vec<&str> = JobState::ALL.iter().map(|st| st.as_str()).collect();
    let state = match q.state.as_deref() {
        Some(raw) => Some(params::one_of("state", raw, &states)?.parse::<JobState>().map_err(Problem::bad_request)?),
        None => None,
    };
    if let Some(kind) = q.kind.as_deref() {
        params::one_of("kind", kind, &s.engine.registry().kinds())?;
    }
    let created_since = q.created_since.as_deref().map(|t| params::time("created_since", t)).transpose()?;
    let before = q.before.as_deref().map(|b| params::whole("before", b, 1..=i64::MAX)).transpose()?;
    let tenant = match (&p.tenant, q.tenant) {
        (Some(own), Some(asked)) if *own != asked => {
            return Ok(Json(json!({ "jobs": [], "next": null })));
        }
        (Some(own), _) => Some(own.clone()),
        (None, asked) => asked,
    };
    // `user` narrows to subjects ending in /<user>, within the tenant when one is given
    let subject = match (q.subject, q.user, &tenant) {
        (Some(s), _, _) => Some(s),
        (None, Some(u), Some(t)) => Some(format!("{t}/{u}")),
        (None, Some(_), None) => {
            return Err(Problem::bad_request("filtering by user needs a tenant"));
        }
        (None, None, _) => None,
    };
    let limit = q.limit.as_deref().map(|l| params::whole("limit", l, 1..=500)).transpose()?.unwrap_or(50) as u32;
    // a scoped token: its own tenant's jobs, when that is a registry tenant, never the reconciler's
    let hide_kinds_starting = p.tenant.as_ref().map(|_| UNSCOPED_KINDS.to_string());
    if let Some(own) = &p.tenant
        && s.tenants.as_deref().is_none_or(|r| r.tenant(own).is_none())
    {
        return Ok(Json(json!({ "jobs": [], "next": null })));
    }
    let filter = JobFilter {
        state,
        kind: q.kind,
        subject,
        tenant,
        created_since,
        before_id: before,
        limit,
        hide_kinds_starting,
    };
    let jobs = s.engine.list(&filter).await?;
    let next = (jobs.len() == limit as usize).then(|| jobs.last().map(|j| j.id)).flatten();
    Ok(Json(json!({ "jobs": jobs, "next": next })))
}

/// The job, if the caller may see it; otherwise "not found", as if it did not exist.
async fn visible(s: &AppState, p: &Principal, id: i64) -> Result<Job, Problem> {
    let job = s.engine.job(id).await?;
    if p.sees_job(&job.kind, &job.tenant, s.tenants.as_deref()) {
        Ok(job)
    } else {
        Err(Problem::not_found(format!("job {id} not found")))
    }
}

async fn show(auth: Auth, State(s): State<Shared>, PathParam(id): PathParam<String>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let id = params::job_id(&id)?;
    let job = visible(&s, p, id).await?;
    let steps = s.engine.step_runs(id).await?;
    let events = s.engine.events(id).await?;
    Ok(Json(json!({ "job": job, "steps": steps, "events": events })))
}

#[derive(Debug, Default, Deserialize)]
struct CancelBody {
    reason: Option<String>,
}

async fn cancel(
    auth: Auth,
    State(s): State<Shared>,
    PathParam(id): PathParam<String>,
    OptBody(body): OptBody<CancelBody>,
) -> Result<Json<Job>, Problem> {
    let p = auth.require(Role::Operator)?;
    let id = params::job_id(&id)?;
    visible(&s, p, id).await?;
    Ok(Json(s.engine.cancel(id, &p.actor(), body.reason.as_deref()).await?))
}

async fn retry(auth: Auth, State(s): State<Shared>, PathParam(id): PathParam<String>) -> Result<Json<Job>, Problem> {
    let p = auth.require(Role::Operator)?;
    let id = params::job_id(&id)?;
    visible(&s, p, id).await?;
    Ok(Json(s.engine.retry(id, &p.actor()).await?))
}

async fn approve(auth: Auth, State(s): State<Shared>, PathParam(id): PathParam<String>) -> Result<Json<Job>, Problem> {
    let p = auth.require(Role::Operator)?;
    let id = params::job_id(&id)?;
    let job = visible(&s, p, id).await?;
    // what an offboarding waits for (a hard cutoff, a whole tenant's departure) is irreversible
    if ADMIN_APPROVALS.contains(&job.kind.as_str()) {
        auth.require(Role::Admin).map_err(|_| {
            Problem::forbidden(format!(
                "approving a {} (a hard cutoff or a tenant's departure) needs an admin token",
                job.kind
            ))
        })?;
    }
    Ok(Json(s.engine.approve(id, &p.actor()).await?))
}

/// Kinds whose approvals only an admin gives (the dashboard shows their Approve button to admins).
const ADMIN_APPROVALS: &[&str] = &[crate::flows::user_offboard::USER_OFFBOARD, crate::flows::tenant::TENANT_OFFBOARD];

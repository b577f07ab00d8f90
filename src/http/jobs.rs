//! /v1/jobs: list (keyset pages), one job with its attempts and audit trail, a live stream of
//! changes, and the actions cancel, retry and approve. A tenant-scoped token sees its tenant only
//! (a registry tenant, never the reconciler's jobs): anything else is "not found". Approving a
//! four-eyes step (a hard cutoff, a tenant offboarding, a brake's release) is refused to the token
//! that started the job (403).

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::auth::Auth;
use super::extract::{OptBody, Params, PathParam};
use super::{AppState, Problem, Route, route};
use crate::engine::{Job, JobFilter, JobState};
use crate::http::access::{Principal, Role, UNSCOPED_KINDS};

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/whoami", whoami),
        route(Method::GET, "/v1/jobs", list),
        route(Method::GET, "/v1/jobs/{id}", show),
        route(Method::GET, "/v1/stream", stream).long_lived(),
        route(Method::POST, "/v1/jobs/{id}/cancel", cancel),
        route(Method::POST, "/v1/jobs/{id}/retry", retry),
        route(Method::POST, "/v1/jobs/{id}/approve", approve),
    ]
}

async fn whoami(auth: Auth) -> Json<Value> {
    let p = auth.0;
    Json(json!({ "token": p.token_name, "role": p.role, "tenant": p.tenant }))
}

#[derive(Debug, Deserialize)]
struct ListQuery {
    state: Option<String>,
    kind: Option<String>,
    subject: Option<String>,
    tenant: Option<String>,
    user: Option<String>,
    #[serde(default, with = "time::serde::rfc3339::option")]
    created_since: Option<OffsetDateTime>,
    /// Keyset cursor: the `next` of the previous page.
    before: Option<i64>,
    limit: Option<u32>,
}

async fn list(auth: Auth, State(s): State<AppState>, Params(q): Params<ListQuery>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let state = q.state.as_deref().map(str::parse::<JobState>).transpose().map_err(Problem::bad_request)?;
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
    let limit = q.limit.unwrap_or(50).clamp(1, 500);
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
        created_since: q.created_since,
        before_id: q.before,
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

async fn show(auth: Auth, State(s): State<AppState>, PathParam(id): PathParam<i64>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
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
    State(s): State<AppState>,
    PathParam(id): PathParam<i64>,
    OptBody(body): OptBody<CancelBody>,
) -> Result<Json<Job>, Problem> {
    let p = auth.require(Role::Operator)?;
    visible(&s, p, id).await?;
    Ok(Json(s.engine.cancel(id, &p.actor(), body.reason.as_deref()).await?))
}

async fn retry(auth: Auth, State(s): State<AppState>, PathParam(id): PathParam<i64>) -> Result<Json<Job>, Problem> {
    let p = auth.require(Role::Operator)?;
    visible(&s, p, id).await?;
    Ok(Json(s.engine.retry(id, &p.actor()).await?))
}

async fn approve(auth: Auth, State(s): State<AppState>, PathParam(id): PathParam<i64>) -> Result<Json<Job>, Problem> {
    let p = auth.require(Role::Operator)?;
    visible(&s, p, id).await?;
    Ok(Json(s.engine.approve(id, &p.actor()).await?))
}

/// Server-sent events: `job` with the job whenever one changes (its state, step, attempt or
/// timer), from the moment of connecting. Polls every half second with an overlap window, since a
/// transaction's `updated_at` is its start time and it may commit after later ones.
async fn stream(
    auth: Auth,
    State(s): State<AppState>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, Problem> {
    let p = auth.require(Role::Viewer)?.clone();
    let start = s.engine.now().await?;
    let feed = Feed { s, p, since: start, sent: HashMap::new(), queue: Vec::new() };
    Ok(Sse::new(futures_util::stream::unfold(feed, Feed::next)).keep_alive(KeepAlive::default()))
}

const OVERLAP: time::Duration = time::Duration::seconds(5);

struct Feed {
    s: AppState,
    p: Principal,
    since: OffsetDateTime,
    /// What was sent in the overlap window: job id -> updated_at.
    sent: HashMap<i64, OffsetDateTime>,
    queue: Vec<Event>,
}

impl Feed {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Self)> {
        loop {
            if let Some(e) = self.queue.pop() {
                return Some((Ok(e), self));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            let jobs = match self.s.engine.changed_since(self.since - OVERLAP, self.p.tenant.as_deref(), 500).await {
                Ok(j) => j,
                Err(e) => {
                    tracing::warn!(error = %e, "job stream: query failed");
                    continue;
                }
            };
            let registry = self.s.tenants.clone();
            for j in jobs.iter().rev() {
                if self.sent.get(&j.id) == Some(&j.updated_at) {
                    continue;
                }
                self.sent.insert(j.id, j.updated_at);
                if self.p.sees_job(&j.kind, &j.tenant, registry.as_deref())
                    && let Ok(e) = Event::default().event("job").json_data(j)
                {
                    self.queue.push(e);
                }
                self.since = self.since.max(j.updated_at);
            }
            let horizon = self.since - OVERLAP - OVERLAP;
            self.sent.retain(|_, at| *at > horizon);
        }
    }
}

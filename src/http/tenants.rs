//! /v1/tenants: each tenant of the registry with its limits, teams, quotas, Kubernetes names,
//! member counts, jobs in flight and drift; /v1/drift: the latest full reconcile's report. Member
//! counts and drift come from the latest finished reconcile of the tenant (`reconcile.full` or
//! `reconcile.tenant`), with the time it was measured; `null` until one has run. A tenant-scoped
//! token sees its own tenant.
//!
//! Drift is kept fresh between reconciles: the onboardings and offboardings a report started
//! that have succeeded since are no longer counted (`onboard`, `offboard`), with what was
//! measured (`measured`), what settled since (`settled_since`), and both times (`measured_at`,
//! `as_of`).
//!
//! Neither reads the job history: both are bounded queries. Reports come from the newest
//! `LATEST_SCAN` succeeded reconciles of each kind (an index read backwards; the periodic full
//! reconcile names every tenant, so a tenant it cannot find there has not been measured for a
//! long time), and jobs in flight from the partial index of unfinished jobs per tenant.

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::auth::Auth;
use super::extract::PathParam;
use super::{AppState, Problem, Route, Shared, route};
use crate::domain::tenants::Tenant;
use crate::engine::{JobState, OutputArray};
use crate::flows::reconcile::{RECONCILE_FULL, RECONCILE_TENANT};
use crate::http::access::Role;

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/tenants", list),
        route(Method::GET, "/v1/tenants/{tenant}", show),
        route(Method::GET, "/v1/drift", drift),
    ]
}

fn rfc3339(t: OffsetDateTime) -> Value {
    json!(t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default())
}

async fn list(auth: Auth, State(s): State<Shared>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let reg = s.registry()?;
    let tenants: Vec<&Tenant> = reg.tenants.iter().filter(|t| p.sees(t.name.as_str())).collect();
    Ok(Json(json!({ "tenants": summaries(&s, &tenants).await? })))
}

async fn show(auth: Auth, State(s): State<Shared>, PathParam(name): PathParam<String>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let reg = s.registry()?;
    let t = reg
        .tenant(&name)
        .filter(|t| p.sees(t.name.as_str()))
        .ok_or_else(|| Problem::not_found(format!("tenant {name:?} not found")))?;
    let mut out = summaries(&s, &[t]).await?;
    Ok(Json(out.pop().unwrap_or(Value::Null)))
}

/// The latest finished reconcile report entry of each tenant: (job id, finished, entry).
type Reports = BTreeMap<String, (i64, OffsetDateTime, Value)>;

/// Where a reconcile keeps its per-tenant report entries.
pub(super) const REPORT_ENTRIES: OutputArray<'static> =
    OutputArray { kinds: &[RECONCILE_FULL, RECONCILE_TENANT], path: &["reconcile", "tenants"], field: "tenant" };

async fn latest_reports(s: &AppState, names: &[&str]) -> Result<Reports, Problem> {
    let entries = s.engine.latest_entries(&REPORT_ENTRIES, names).await?;
    Ok(entries.into_iter().map(|e| (e.key, (e.job, e.finished_at, e.entry))).collect())
}

/// Unfinished jobs of each tenant: kind -> (count, of which failed or waiting for approval).
async fn in_flight(s: &AppState, names: &[&str]) -> Result<BTreeMap<String, BTreeMap<String, (i64, i64)>>, Problem> {
    let mut out: BTreeMap<String, BTreeMap<String, (i64, i64)>> = BTreeMap::new();
    for c in s.engine.open_counts(names).await? {
        let (n, attention) = out.entry(c.tenant).or_default().entry(c.kind).or_default();
        *n += c.jobs;
        if matches!(c.state, JobState::Failed | JobState::NeedsApproval) {
            *attention += c.jobs;
        }
    }
    Ok(out)
}

/// The jobs named in the reports that have succeeded since (their drift is gone).
async fn settled(s: &AppState, reports: &Reports) -> Result<BTreeSet<i64>, Problem> {
    let ids: Vec<i64> = reports
        .values()
        .flat_map(|(_, _, e)| e["jobs"].as_array().into_iter().flatten().filter_map(|j| j["job"].as_i64()))
        .collect();
    let now = s.engine.standings(&ids).await?;
    Ok(now.into_iter().filter(|j| j.state == JobState::Succeeded).map(|j| j.id).collect())
}

fn count(v: &Value) -> usize {
    v.as_array().map_or(0, Vec::len)
}

async fn summaries(s: &AppState, tenants: &[&Tenant]) -> Result<Vec<Value>, Problem> {
    let names: Vec<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
    let reports = latest_reports(s, &names).await?;
    let flight = in_flight(s, &names).await?;
    let settled = settled(s, &reports).await?;
    let now = rfc3339(s.engine.now().await?);
    let empty = BTreeMap::new();
    Ok(tenants
        .iter()
        .map(|t| {
            let jobs = flight.get(t.name.as_str()).unwrap_or(&empty);
            let by_kind: BTreeMap<&str, i64> = jobs.iter().map(|(k, (n, _))| (k.as_str(), *n)).collect();
            let (members, drift) = match reports.get(t.name.as_str()) {
                Some((job, at, e)) => {
                    let members = match e.get("members") {
                        Some(m) if m.is_object() => {
                            let mut m = m.clone();
                            m["measured_at"] = rfc3339(*at);
                            m["job"] = json!(job);
                            m
                        }
                        _ => Value::Null,
                    };
                    let ops = |op: &str| e["jobs"].as_array().map_or(0, |a| a.iter().filter(|j| j["op"] == op).count());
                    // the report's jobs that have succeeded since: that drift is gone
                    let done = |op: &str| {
                        e["jobs"].as_array().map_or(0, |a| {
                            a.iter()
                                .filter(|j| j["op"] == op && j["job"].as_i64().is_some_and(|id| settled.contains(&id)))
                                .count()
                        })
                    };
                    let (onboarded, offboarded) = (done("onboard"), done("offboard"));
                    let drift = json!({
                        "measured_at": rfc3339(*at),
                        "as_of": now,
                        "job": job,
                        "decision": e["decision"],
                        "onboard": ops("onboard") - onboarded,
                        "offboard": ops("offboard") - offboarded,
                        "measured": { "onboard": ops("onboard"), "offboard": ops("offboard") },
                        "settled_since": { "onboarded": onboarded, "offboarded": offboarded },
                        "held": count(&e["held"]),
                        "skipped": count(&e["skipped"]),
                        "unchanged": e["unchanged"].as_u64(),
                        "reason": e["reason"],
                    });
                    (members, drift)
                }
                None => (Value::Null, Value::Null),
            };
            json!({
                "name": t.name,
                "description": t.description,
                "group": t.group,
                "account": t.account,
                "default_account": t.default_account,
                "limits": t.limits,
                "user_defaults": t.user_defaults,
                "quotas": t.quotas,
                "teams": t.teams,
                "kubernetes": t.kubernetes,
                "members": members,
                "jobs_in_flight": {
                    "total": by_kind.values().sum::<i64>(),
                    "needs_attention": jobs.values().map(|(_, a)| a).sum::<i64>(),
                    "by_kind": by_kind,
                },
                "drift": drift,
            })
        })
        .collect())
}

/// The latest finished full reconcile's report, narrowed to the caller's tenant when scoped.
async fn drift(auth: Auth, State(s): State<Shared>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let latest = s.engine.latest_succeeded(&[RECONCILE_FULL]).await?;
    let Some((job, finished_at)) = latest.and_then(|j| j.finished_at.map(|at| (j, at))) else {
        return Err(Problem::not_found("no full reconcile has finished yet"));
    };
    let cause = job.input.get("cause").cloned().unwrap_or(Value::Null);
    let mut report = job.outputs.get("reconcile").cloned().unwrap_or_else(|| json!({}));
    let job = job.id;
    if let (Some(own), Some(list)) = (&p.tenant, report.get_mut("tenants").and_then(Value::as_array_mut)) {
        list.retain(|e| e["tenant"].as_str() == Some(own.as_str()));
    }
    Ok(Json(json!({ "job": job, "finished_at": rfc3339(finished_at), "cause": cause, "report": report })))
}

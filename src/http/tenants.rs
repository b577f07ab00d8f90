//! /v1/tenants: each tenant of the registry with its limits, teams, quotas, member counts, jobs in
//! flight and drift; /v1/drift: the latest full reconcile's report. Member counts and drift come
//! from the latest finished reconcile of the tenant (`reconcile.full` or `reconcile.tenant`), with
//! the time it was measured; `null` until one has run. A tenant-scoped token sees its own tenant.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::auth::Auth;
use super::extract::PathParam;
use super::{AppState, Problem, Route, route};
use crate::domain::tenants::Tenant;
use crate::engine::EngineError;
use crate::flows::reconcile::{RECONCILE_FULL, RECONCILE_TENANT};
use crate::http::access::Role;

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/tenants", list),
        route(Method::GET, "/v1/tenants/{tenant}", show),
        route(Method::GET, "/v1/drift", drift),
    ]
}

fn db(e: sqlx::Error) -> Problem {
    Problem::from(EngineError::from(e))
}

fn rfc3339(t: OffsetDateTime) -> Value {
    json!(t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default())
}

async fn list(auth: Auth, State(s): State<AppState>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let reg = s.registry()?;
    let tenants: Vec<&Tenant> = reg.tenants.iter().filter(|t| p.sees(t.name.as_str())).collect();
    Ok(Json(json!({ "tenants": summaries(&s, &tenants).await? })))
}

async fn show(
    auth: Auth,
    State(s): State<AppState>,
    PathParam(name): PathParam<String>,
) -> Result<Json<Value>, Problem> {
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

async fn latest_reports(s: &AppState, names: &[&str]) -> Result<Reports, Problem> {
    let rows: Vec<(String, i64, OffsetDateTime, Value)> = sqlx::query_as(
        "select t.name, j.id, j.finished_at, j.entry
         from unnest($1::text[]) t(name)
         join lateral (
           select j.id, j.finished_at,
                  (select x from jsonb_array_elements(j.outputs -> 'reconcile' -> 'tenants') x
                   where x ->> 'tenant' = t.name limit 1) as entry
           from jobs j
           where j.kind in ($2, $3) and j.state = 'succeeded' and j.finished_at is not null
             and j.outputs -> 'reconcile' -> 'tenants' @> jsonb_build_array(jsonb_build_object('tenant', t.name))
           order by j.finished_at desc
           limit 1) j on true",
    )
    .bind(names)
    .bind(RECONCILE_FULL)
    .bind(RECONCILE_TENANT)
    .fetch_all(s.engine.pool())
    .await
    .map_err(db)?;
    Ok(rows.into_iter().map(|(n, id, at, entry)| (n, (id, at, entry))).collect())
}

/// Unfinished jobs of each tenant: kind -> (count, of which failed or waiting for approval).
async fn in_flight(s: &AppState, names: &[&str]) -> Result<BTreeMap<String, BTreeMap<String, (i64, i64)>>, Problem> {
    let rows: Vec<(String, String, i64, i64)> = sqlx::query_as(
        "select tenant, kind, count(*), count(*) filter (where state in ('failed', 'needs_approval'))
         from jobs where tenant = any($1) and state not in ('succeeded', 'cancelled')
         group by tenant, kind",
    )
    .bind(names)
    .fetch_all(s.engine.pool())
    .await
    .map_err(db)?;
    let mut out: BTreeMap<String, BTreeMap<String, (i64, i64)>> = BTreeMap::new();
    for (tenant, kind, n, attention) in rows {
        out.entry(tenant).or_default().insert(kind, (n, attention));
    }
    Ok(out)
}

fn count(v: &Value) -> usize {
    v.as_array().map_or(0, Vec::len)
}

async fn summaries(s: &AppState, tenants: &[&Tenant]) -> Result<Vec<Value>, Problem> {
    let names: Vec<&str> = tenants.iter().map(|t| t.name.as_str()).collect();
    let reports = latest_reports(s, &names).await?;
    let flight = in_flight(s, &names).await?;
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
                    let drift = json!({
                        "measured_at": rfc3339(*at),
                        "job": job,
                        "decision": e["decision"],
                        "onboard": ops("onboard"),
                        "offboard": ops("offboard"),
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
async fn drift(auth: Auth, State(s): State<AppState>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let row: Option<(i64, OffsetDateTime, Value, Value)> = sqlx::query_as(
        "select id, finished_at, coalesce(input -> 'cause', 'null'), coalesce(outputs -> 'reconcile', '{}')
         from jobs
         where kind = $1 and state = 'succeeded' and finished_at is not null
         order by finished_at desc limit 1",
    )
    .bind(RECONCILE_FULL)
    .fetch_optional(s.engine.pool())
    .await
    .map_err(db)?;
    let Some((job, finished_at, cause, mut report)) = row else {
        return Err(Problem::not_found("no full reconcile has finished yet"));
    };
    if let (Some(own), Some(list)) = (&p.tenant, report.get_mut("tenants").and_then(Value::as_array_mut)) {
        list.retain(|e| e["tenant"].as_str() == Some(own.as_str()));
    }
    Ok(Json(json!({ "job": job, "finished_at": rfc3339(finished_at), "cause": cause, "report": report })))
}

//! /v1/tenants/{tenant}/users: each user onramp knows in a tenant with their state and why (from
//! their latest onboarding or offboarding job), whether they are a member of the tenant's group
//! and their association with its limits as last read (the latest reconcile report; the
//! onboarding's `slurm_association` step), and for one user their jobs. A user is known when a
//! job names them, the tenant's latest reconcile report does, or Authentik lists them in the
//! tenant's group now (read live, so users in sync since before onramp are listed too). A tenant-scoped token sees its
//! own tenant only (404 otherwise, as /v1/tenants/{tenant} does).

mod state;

use std::collections::{BTreeMap, BTreeSet};

use axum::Json;
use axum::extract::State;
use axum::http::Method;
use serde::Deserialize;
use serde_json::{Value, json};
use time::OffsetDateTime;

use super::auth::Auth;
use super::extract::PathParam;
use super::tenants::REPORT_ENTRIES;
use super::{AppState, Problem, Route, Shared, route};
use crate::backends::slurm::Limit;
use crate::domain::names::Username;
use crate::domain::tenants::Tenant;
use crate::engine::{Job, JobFilter, JobState, StepOutput};
use crate::flows::user_offboard::USER_OFFBOARD;
use crate::flows::user_onboard::{self, USER_ONBOARD};
use crate::http::access::{Principal, Role, UNSCOPED_KINDS};
use state::{Reading, UserState, rfc3339};

/// The kinds whose jobs say where a user stands.
const USER_KINDS: &[&str] = &[USER_ONBOARD, USER_OFFBOARD];
/// How many of a user's jobs one answer lists (newest first).
const USER_JOBS: u32 = 50;

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/tenants/{tenant}/users", list),
        route(Method::GET, "/v1/tenants/{tenant}/users/{username}", show),
    ]
}

/// The tenant, if the caller may see it; otherwise 404.
fn tenant<'a>(s: &'a AppState, p: &Principal, name: &str) -> Result<&'a Tenant, Problem> {
    s.registry()?
        .tenant(name)
        .filter(|t| p.sees(t.name.as_str()))
        .ok_or_else(|| Problem::not_found(format!("tenant {name:?} not found")))
}

async fn list(auth: Auth, State(s): State<Shared>, PathParam(name): PathParam<String>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let t = tenant(&s, p, &name)?;
    let known = Known::read(&s, t, None).await?;
    let users: Vec<Value> = known.usernames().iter().map(|u| known.status(&s, t, u)).collect();
    Ok(Json(json!({ "tenant": t.name, "as_of": known.report.as_ref().map(|r| rfc3339(r.at)), "users": users })))
}

async fn show(
    auth: Auth,
    State(s): State<Shared>,
    PathParam((name, username)): PathParam<(String, String)>,
) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let t = tenant(&s, p, &name)?;
    let user = Username::parse(&username).map_err(|e| Problem::bad_request(e.to_string()))?;
    let known = Known::read(&s, t, Some(&user)).await?;
    if !known.usernames().contains(user.as_str()) {
        return Err(Problem::not_found(format!(
            "onramp knows nothing of user {user} in tenant {}: no job names them and the latest reconcile did not \
             find them in {}",
            t.name, t.group
        )));
    }
    let mut out = known.status(&s, t, user.as_str());
    let filter = JobFilter {
        subject: Some(subject(t, user.as_str())),
        tenant: Some(t.name.to_string()),
        limit: USER_JOBS,
        hide_kinds_starting: p.tenant.as_ref().map(|_| UNSCOPED_KINDS.to_string()),
        ..Default::default()
    };
    out["jobs"] = json!(s.engine.list(&filter).await?);
    Ok(Json(out))
}

fn subject(t: &Tenant, user: &str) -> String {
    format!("{}/{user}", t.name)
}

/// The tenant's latest reconcile report entry.
struct Report {
    at: OffsetDateTime,
    /// Users it named: username -> member (an onboarding named: true; an offboarding or a held
    /// one: false).
    named: BTreeMap<String, bool>,
    /// Users whose offboarding the safety brake held, when its hold job still waits for approval.
    held: BTreeSet<String>,
    /// That hold job, and why it holds.
    hold: Option<(i64, String)>,
}

/// What onramp knows of a tenant's users (or of one).
struct Known {
    /// Each user's latest job that was not cancelled.
    live: BTreeMap<String, Job>,
    /// Each user's latest job.
    latest: BTreeMap<String, Job>,
    /// Each user's latest association as the onboarding read it.
    association: BTreeMap<String, StepOutput>,
    report: Option<Report>,
    /// The tenant's group's active members, read from Authentik now (None: not configured, or
    /// it did not answer in time).
    members: Option<BTreeSet<String>>,
}

/// The active members of the tenant's group in Authentik now, within a few seconds.
async fn members_now(s: &AppState, t: &Tenant) -> Option<BTreeSet<String>> {
    let ak = s.authentik.as_deref()?;
    match tokio::time::timeout(std::time::Duration::from_secs(5), ak.active_members(&t.group)).await {
        Ok(Ok(users)) => Some(users.into_iter().map(|u| u.username).collect()),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, tenant = %t.name, "users: the group's members could not be read");
            None
        }
        Err(_) => {
            tracing::warn!(tenant = %t.name, "users: Authentik did not list the group's members in time");
            None
        }
    }
}

impl Known {
    async fn read(s: &AppState, t: &Tenant, user: Option<&Username>) -> Result<Self, Problem> {
        let tenant = t.name.as_str();
        let subject = user.map(|u| subject(t, u.as_str()));
        let subject = subject.as_deref();
        let by_user = |jobs: Vec<Job>| -> BTreeMap<String, Job> {
            jobs.into_iter().filter_map(|j| Some((username_of(t, &j.subject)?, j))).collect()
        };
        let live = by_user(s.engine.latest_per_subject(tenant, USER_KINDS, subject, &[JobState::Cancelled]).await?);
        let latest = by_user(s.engine.latest_per_subject(tenant, USER_KINDS, subject, &[]).await?);
        let step = user_onboard::Step::SlurmAssociation.name();
        let association = s
            .engine
            .latest_step_outputs(tenant, &[USER_ONBOARD], step, subject)
            .await?
            .into_iter()
            .filter_map(|o| Some((username_of(t, &o.subject)?, o)))
            .collect();
        let entry = s.engine.latest_entries(&REPORT_ENTRIES, &[tenant]).await?.into_iter().next();
        let report = entry.map(|e| {
            let mut named = BTreeMap::new();
            for j in e.entry["jobs"].as_array().into_iter().flatten() {
                if let Some(u) = j["username"].as_str() {
                    named.insert(u.to_string(), j["op"] == "onboard");
                }
            }
            let mut held = BTreeSet::new();
            for h in e.entry["held"].as_array().into_iter().flatten().filter_map(Value::as_str) {
                if let Some((_, u)) = h.split_once('/') {
                    named.insert(u.to_string(), false);
                    held.insert(u.to_string());
                }
            }
            if let Some(u) = user {
                named.retain(|n, _| n == u.as_str());
                held.retain(|n| n == u.as_str());
            }
            let why = e.entry["reason"].as_str().unwrap_or("the safety brake holds it").to_string();
            let hold = e.entry["hold_job"].as_i64().map(|id| (id, why));
            Report { at: e.finished_at, named, held, hold }
        });
        // the held set matters only while its hold job waits for a person
        let mut report = report;
        if let Some(r) = report.as_mut().filter(|r| !r.held.is_empty()) {
            let ids: Vec<i64> = r.hold.iter().map(|(id, _)| *id).collect();
            let waiting = s.engine.standings(&ids).await?.iter().any(|j| j.state == JobState::NeedsApproval);
            if !waiting {
                r.held.clear();
            }
        }
        let members = members_now(s, t).await.map(|m| match user {
            Some(u) => m.into_iter().filter(|n| n == u.as_str()).collect(),
            None => m,
        });
        Ok(Self { live, latest, association, report, members })
    }

    fn usernames(&self) -> BTreeSet<&str> {
        let named = self.report.iter().flat_map(|r| r.named.keys());
        let members = self.members.iter().flatten();
        self.latest.keys().chain(named).chain(members).map(String::as_str).collect()
    }

    /// One user's status (UserStatus in openapi.yaml).
    fn status(&self, s: &AppState, t: &Tenant, user: &str) -> Value {
        let job = self.live.get(user).or_else(|| self.latest.get(user));
        let member = self.member(user, job);
        let held = self.held(user, job);
        let reading = match job {
            _ if held.is_some() => Reading {
                state: UserState::WaitingForApproval,
                reason: format!(
                    "waiting for approval: the safety brake holds this offboarding with others (job {}): {}",
                    held.map_or(0, |(id, _)| id),
                    held.map_or("", |(_, why)| why)
                ),
                step: None,
                retention_until: None,
            },
            Some(j) => {
                let max = s.engine.registry().get(&j.kind).map(|f| f.policy(j.step_index as usize).max_attempts);
                state::read(j, max)
            }
            // in the group now, and the latest reconcile found nothing to do for them: in sync
            None if self.in_sync(user, member) => Reading {
                state: UserState::Onboarded,
                reason: format!(
                    "in {} and in Slurm: the reconcile at {} found nothing to do for them (onboarded before onramp's \
                     history)",
                    t.group,
                    self.report.as_ref().map(|r| rfc3339(r.at)).unwrap_or_default()
                ),
                step: None,
                retention_until: None,
            },
            None => Reading {
                state: UserState::NotOnboarded,
                reason: match (&self.report, member) {
                    (Some(r), Some(false)) => format!(
                        "not a member of {} as read at {}, and onramp has no job of this user",
                        t.group,
                        rfc3339(r.at)
                    ),
                    (Some(r), _) => {
                        format!("a member of {} as read at {} with no onboarding job yet", t.group, rfc3339(r.at))
                    }
                    (None, _) => "no onboarding job yet".into(),
                },
                step: None,
                retention_until: None,
            },
        };
        let read = self.association.get(user).filter(|_| reading.state != UserState::Offboarded);
        let association =
            read.and_then(|o| Some((o, serde_json::from_value::<AssociationRead>(o.output.clone()).ok()?)));
        let association = association.map(|(o, a)| {
            let blocked = matches!(reading.state, UserState::Blocked | UserState::InRetention | UserState::Offboarding)
                || (reading.state == UserState::WaitingForApproval && job.is_some_and(|j| j.kind == USER_OFFBOARD));
            json!({
                "account": a.account,
                "limits": { "max_jobs": count_limit(a.max_jobs), "qos": a.qos },
                "default_account": a.default_account,
                "blocked": blocked,
                "job": o.job,
                "read_at": rfc3339(o.at),
            })
        });
        let updated = job.map(|j| j.updated_at).or(self.report.as_ref().map(|r| r.at));
        json!({
            "username": user,
            "tenant": t.name,
            "state": reading.state,
            "reason": reading.reason,
            "step": reading.step,
            "job": held.map(|(id, _)| id).or(job.map(|j| j.id)),
            "retention_until": reading.retention_until.map(rfc3339),
            "member": member,
            "association": association,
            "updated_at": updated.map(rfc3339),
        })
    }

    /// A member now whom the latest reconcile did not name (it found their association as it
    /// should be).
    fn in_sync(&self, user: &str, member: Option<bool>) -> bool {
        member == Some(true) && self.report.as_ref().is_some_and(|r| !r.named.contains_key(user))
    }

    /// The brake's hold of this user's offboarding (hold job, why), when the report that held it
    /// is newer than the user's latest job and the hold still waits for approval.
    fn held(&self, user: &str, job: Option<&Job>) -> Option<(i64, &str)> {
        let r = self.report.as_ref().filter(|r| job.is_none_or(|j| r.at >= j.created_at))?;
        let (id, why) = r.hold.as_ref().filter(|_| r.held.contains(user))?;
        Some((*id, why.as_str()))
    }

    /// In the tenant's group, as last read: by the latest reconcile report when it is newer than
    /// the user's latest job; else by that job when the reconciler started it (it found them a
    /// member, or not); else unknown.
    fn member(&self, user: &str, job: Option<&Job>) -> Option<bool> {
        let report = self.report.as_ref().filter(|r| job.is_none_or(|j| r.at >= j.created_at));
        if let Some(r) = report {
            if let Some(m) = r.named.get(user) {
                return Some(*m);
            }
            // not named by a pass after the job: the cluster already matched Authentik
            return match job.map(|j| (j.kind.as_str(), j.state)) {
                Some((USER_ONBOARD, JobState::Succeeded)) => Some(true),
                Some((USER_OFFBOARD, JobState::Succeeded)) => Some(false),
                _ => self.members.as_ref().map(|m| m.contains(user)),
            };
        }
        let by_reconciler = job.filter(|j| j.created_by == crate::engine::Actor::reconciler().as_str());
        match by_reconciler.map(|j| j.kind.as_str()) {
            Some(USER_ONBOARD) => Some(true),
            Some(USER_OFFBOARD) => Some(false),
            // else Authentik's answer now, when there is one
            _ => self.members.as_ref().map(|m| m.contains(user)),
        }
    }
}

/// What the onboarding's `slurm_association` step recorded of the association it read back.
#[derive(Debug, Deserialize)]
struct AssociationRead {
    account: String,
    #[serde(default)]
    max_jobs: Option<Limit>,
    #[serde(default)]
    qos: Vec<String>,
    #[serde(default)]
    default_account: Option<String>,
}

/// A count limit: the number, or null for none.
fn count_limit(l: Option<Limit>) -> Option<u64> {
    match l? {
        Limit::At(n) => Some(n),
        Limit::Unlimited => None,
    }
}

/// `tenant/user` → `user`, for a subject of this tenant.
fn username_of(t: &Tenant, subject: &str) -> Option<String> {
    subject.strip_prefix(t.name.as_str())?.strip_prefix('/').map(String::from)
}

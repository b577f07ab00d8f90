//! POST /v1/jobs: start work (operator). Onboard or offboard a user, onboard or offboard a
//! tenant, or run a full reconcile. The jobs are built by the same constructors the reconciler and
//! the CLI use, so a portal's request and a webhook's reconcile dedupe to one job. Every name is
//! checked and the tenant and account looked up in the tenant registry; a tenant-scoped token
//! starts work for its own tenant only. A hard cutoff and a tenant offboarding need the admin
//! role; a user offboarding needs a user who is, or was, in the tenant (422 otherwise).
//!
//! Answers 202 with the job when this request created it, 200 with the job when it is one that
//! already existed: the same `Idempotency-Key` and request again (header `Idempotent-Replayed:
//! true`), or an unfinished job doing the same work.

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};

use super::auth::Auth;
use super::extract::Body;
use super::{AppState, Problem, Route, Shared, idempotency, route};
use crate::backends::authentik::AuthentikError;
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::domain::tenants::{Tenant, TenantRegistry};
use crate::engine::NewJob;
use crate::flows::tenant::{self, TENANT_OFFBOARD, TENANT_ONBOARD};
use crate::flows::{membership, user_offboard, user_onboard};
use crate::http::access::{Principal, Role};

pub fn routes() -> Vec<Route> {
    vec![route(Method::POST, "/v1/jobs", start)]
}

/// The request, as sent (names not yet checked).
#[derive(Debug, Deserialize, Serialize)]
#[serde(tag = "kind", deny_unknown_fields)]
enum StartWork {
    #[serde(rename = "user.onboard")]
    UserOnboard {
        tenant: String,
        /// The team's Slurm account; the tenant's default account when left out.
        #[serde(default)]
        account: Option<String>,
        username: String,
    },
    #[serde(rename = "user.offboard")]
    UserOffboard {
        tenant: String,
        #[serde(default)]
        account: Option<String>,
        username: String,
        #[serde(default)]
        hard_cutoff: bool,
    },
    #[serde(rename = "tenant.onboard")]
    TenantOnboard { tenant: String },
    #[serde(rename = "tenant.offboard")]
    TenantOffboard {
        tenant: String,
        #[serde(default)]
        hard_cutoff: bool,
    },
    #[serde(rename = "reconcile.full")]
    ReconcileFull {},
}

fn invalid(e: impl ToString) -> Problem {
    Problem::unprocessable(e.to_string())
}

/// The tenant, checked: its name, the caller's scope, then the registry.
fn tenant<'r>(reg: &'r TenantRegistry, p: &Principal, name: &str) -> Result<&'r Tenant, Problem> {
    let name = TenantName::parse(name).map_err(invalid)?;
    if !p.sees(name.as_str()) {
        let own = p.tenant.as_deref().unwrap_or_default();
        return Err(Problem::forbidden(format!("this token starts work for tenant {own} only")));
    }
    reg.tenant(name.as_str()).ok_or_else(|| invalid(format!("tenant {name} is not in the tenant registry")))
}

/// The tenant, account and user of a user's onboarding or offboarding, checked.
fn user_names(
    reg: &TenantRegistry,
    p: &Principal,
    tenant_name: &str,
    account: Option<&str>,
    username: &str,
) -> Result<(TenantName, SlurmAccount, Username), Problem> {
    let t = tenant(reg, p, tenant_name)?;
    let account = match account {
        Some(a) => SlurmAccount::parse(a).map_err(invalid)?,
        None => t.default_account.clone(),
    };
    let accounts = t.accounts();
    if !accounts.contains(&account) {
        let known: Vec<&str> = accounts.iter().map(SlurmAccount::as_str).collect();
        return Err(invalid(format!(
            "account {account} is not one of tenant {}'s accounts ({})",
            t.name,
            known.join(", ")
        )));
    }
    let username = Username::parse(username).map_err(invalid)?;
    reg.identities.check_name(username.as_str()).map_err(invalid)?;
    Ok((t.name.clone(), account, username))
}

/// Why an API caller's job was asked for.
fn reason(p: &Principal) -> String {
    format!("requested through the API by token {}", p.token_name)
}

/// 403 unless the caller is an admin: `what` needs it.
fn admin_for(p: &Principal, what: &str) -> Result<(), Problem> {
    if p.role >= Role::Admin {
        return Ok(());
    }
    Err(Problem::forbidden(format!("{what} needs the admin role; the token has {}", p.role)))
}

/// The job a request asks for, built as the reconciler and the CLI build theirs (so they dedupe).
fn job(reg: &TenantRegistry, p: &Principal, w: &StartWork) -> Result<NewJob, Problem> {
    let cause = p.actor().to_string();
    match w {
        StartWork::UserOffboard { hard_cutoff: true, .. } => admin_for(p, "a hard cutoff")?,
        StartWork::TenantOffboard { .. } => admin_for(p, "offboarding a tenant")?,
        _ => {}
    }
    Ok(match w {
        StartWork::UserOnboard { tenant, account, username } => {
            let (tenant, account, username) = user_names(reg, p, tenant, account.as_deref(), username)?;
            let input = user_onboard::Input {
                tenant: tenant.to_string(),
                account: account.to_string(),
                username: username.to_string(),
                reason: reason(p),
                cause,
                ..Default::default()
            };
            input.job(p.actor())
        }
        StartWork::UserOffboard { tenant, account, username, hard_cutoff } => {
            let (tenant, account, username) = user_names(reg, p, tenant, account.as_deref(), username)?;
            let input = user_offboard::Input {
                tenant: tenant.to_string(),
                account: account.to_string(),
                username: username.to_string(),
                hard_cutoff: *hard_cutoff,
                reason: reason(p),
                cause,
            };
            input.job(p.actor())
        }
        StartWork::TenantOnboard { tenant: name } => {
            let t = tenant(reg, p, name)?;
            tenant::Input { tenant: t.name.to_string(), hard_cutoff: false }.job(TENANT_ONBOARD, p.actor())
        }
        StartWork::TenantOffboard { tenant: name, hard_cutoff } => {
            let t = tenant(reg, p, name)?;
            tenant::Input { tenant: t.name.to_string(), hard_cutoff: *hard_cutoff }.job(TENANT_OFFBOARD, p.actor())
        }
        StartWork::ReconcileFull {} => {
            if let Some(own) = &p.tenant {
                return Err(Problem::forbidden(format!(
                    "a full reconcile spans every tenant; this token acts for tenant {own} only"
                )));
            }
            crate::flows::reconcile::full_job(p.actor(), p.actor().as_str())
        }
    })
}

async fn start(
    auth: Auth,
    State(s): State<Shared>,
    headers: HeaderMap,
    Body(w): Body<StartWork>,
) -> Result<Response, Problem> {
    let p = auth.require(Role::Operator)?;
    let reg = s.registry()?;
    let job = job(reg, p, &w)?;
    match &w {
        StartWork::UserOffboard { tenant, username, .. } => offboardable(&s, reg, tenant, username).await?,
        StartWork::UserOnboard { .. } => onboardable(&s, reg, &job).await?,
        _ => {}
    }
    if s.engine.registry().steps(&job.kind).is_none() {
        return Err(Problem::unavailable(format!(
            "this onramp runs no {} flow: it needs the Authentik settings (ONRAMP_AUTHENTIK_URL, ONRAMP_AUTHENTIK_TOKEN)",
            job.kind
        )));
    }
    let key = idempotency::key(&headers)?;
    // the normalized request (defaults filled in) is what a key is compared by
    let request = serde_json::to_vec(&w).map_err(|_| Problem::internal())?;
    let started = idempotency::start(&s.engine, &p.token_name, key.as_deref(), &request, job).await?;
    let job = s.engine.job(started.job.id).await?;
    let status = if started.job.created { StatusCode::ACCEPTED } else { StatusCode::OK };
    let mut res = (status, Json(&job)).into_response();
    let h = res.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
        h.insert(header::LOCATION, v);
    }
    if started.replayed {
        h.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(res)
}

/// A user onboarding is refused at once (422), not left to fail at its first step, when Authentik
/// (the truth the flow re-reads) says it cannot succeed: no such user, deactivated, not in the
/// tenant's group placing them in the account, or an identity outside the registry's rules.
async fn onboardable(s: &AppState, reg: &TenantRegistry, job: &NewJob) -> Result<(), Problem> {
    let Some(ak) = s.authentik.as_deref() else { return Ok(()) };
    let input: user_onboard::Input = serde_json::from_value(job.input.clone()).map_err(|_| Problem::internal())?;
    let (Some(t), Ok(account)) = (reg.tenant(&input.tenant), SlurmAccount::parse(&input.account)) else {
        return Err(Problem::internal()); // checked by `job` before
    };
    let user = match ak.user_by_username(&input.username).await {
        Ok(u) => u,
        Err(AuthentikError::NotFound(_)) => {
            return Err(invalid(format!(
                "Authentik has no user {}: onboarding needs their Authentik account",
                input.username
            )));
        }
        Err(e) => {
            tracing::warn!(error = %e, "user onboarding: the user could not be read from Authentik");
            return Err(unavailable(format!("cannot read {} from Authentik right now; try again", input.username)));
        }
    };
    if !user.is_active {
        return Err(invalid(format!("{} is deactivated in Authentik", input.username)));
    }
    if user.knows_group_names() && !t.placement(&user.group_names()).contains(&account) {
        return Err(invalid(format!(
            "{} is not in Authentik group {} placing them in account {account}: add them to the group first",
            input.username, t.group
        )));
    }
    reg.check_identity(&input.username, user.pk, &user.attributes).map(|_| ()).map_err(invalid)
}

fn unavailable(detail: String) -> Problem {
    Problem::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", "Unavailable", detail)
}

/// A user offboarding acts only on a member of the tenant, now or before (Authentik's groups of
/// the tenant, or the job history): anyone else (`akadmin`, `root`, another tenant's user) is 422
/// and no job is made. The flow's first step checks the association in Slurm before it changes
/// anything.
async fn offboardable(s: &AppState, reg: &TenantRegistry, tenant: &str, username: &str) -> Result<(), Problem> {
    let (Some(t), Ok(user)) = (reg.tenant(tenant), Username::parse(username)) else {
        return Err(Problem::internal()); // checked by `job` before
    };
    match membership::belongs(s.authentik.as_deref(), &s.engine, t, &user).await {
        Ok(true) => Ok(()),
        Ok(false) => Err(invalid(format!(
            "{user} is not a user of tenant {}: neither in its Authentik group nor ever onboarded there, so there \
             is nothing of theirs to offboard",
            t.name
        ))),
        Err(e) => {
            tracing::warn!(error = %e, "user offboarding: membership could not be read");
            Err(unavailable(format!(
                "cannot check that {user} is a user of tenant {} right now (Authentik or the database did not answer); \
                 try again",
                t.name
            )))
        }
    }
}

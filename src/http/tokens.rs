//! /v1/tokens: admins create, list and revoke API tokens. An admin scoped to a tenant manages
//! that tenant's tokens only, and cannot create unscoped ones. A token's tenant must be in the
//! tenant registry (422 otherwise).

use axum::Json;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Auth;
use super::extract::{Body, PathParam};
use super::{Problem, Route, Shared, route};
use crate::domain::duration::parse_duration;
use crate::domain::names::TenantName;
use crate::http::access::{self, Role, TokenError};

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/tokens", list),
        route(Method::POST, "/v1/tokens", create),
        route(Method::POST, "/v1/tokens/{name}/revoke", revoke),
    ]
}

impl From<TokenError> for Problem {
    fn from(e: TokenError) -> Self {
        match e {
            e @ TokenError::NameTaken(_) => {
                Problem::new(StatusCode::CONFLICT, "token-exists", "Token exists", e.to_string())
            }
            e @ (TokenError::BadName(_) | TokenError::Weak) => Problem::bad_request(e.to_string()),
            e @ TokenError::NotFound(_) => Problem::not_found(e.to_string()),
            TokenError::Db(e) => Problem::from(crate::engine::EngineError::from(e)),
        }
    }
}

async fn list(auth: Auth, State(s): State<Shared>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Admin)?;
    let tokens = access::list(s.engine.pool()).await.map_err(TokenError::from)?;
    let tokens: Vec<_> = tokens.into_iter().filter(|t| p.tenant.is_none() || t.tenant == p.tenant).collect();
    Ok(Json(json!({ "tokens": tokens })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewToken {
    name: String,
    role: String,
    tenant: Option<String>,
    /// e.g. `90d`
    expires_in: Option<String>,
}

async fn create(
    auth: Auth,
    State(s): State<Shared>,
    Body(b): Body<NewToken>,
) -> Result<(StatusCode, Json<Value>), Problem> {
    let p = auth.require(Role::Admin)?;
    let role: Role = b.role.parse().map_err(Problem::bad_request)?;
    let tenant =
        b.tenant.as_deref().map(TenantName::parse).transpose().map_err(|e| Problem::bad_request(e.to_string()))?;
    s.check_scope(p, tenant.as_ref(), |own| format!("this token manages tokens of tenant {own} only"))?;
    let expires_at = match b.expires_in.as_deref() {
        Some(d) => {
            let d = parse_duration(d).map_err(Problem::bad_request)?;
            if d < std::time::Duration::from_secs(60) {
                return Err(Problem::bad_request(format!("expires_in {d:?} is too short: at least 1m")));
            }
            let at =
                time::OffsetDateTime::now_utc().checked_add(time::Duration::try_from(d).unwrap_or(time::Duration::MAX));
            Some(at.ok_or_else(|| Problem::bad_request(format!("expires_in {:?} is too far away", b.expires_in)))?)
        }
        None => None,
    };
    let token = access::create(s.engine.pool(), &b.name, role, tenant.as_ref(), expires_at, &p.actor()).await?;
    let body = json!({
        "name": b.name, "role": role, "tenant": tenant, "token": token.expose(),
        "expires_at": expires_at.map(|t| t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()),
    });
    Ok((StatusCode::CREATED, Json(body)))
}

async fn revoke(
    auth: Auth,
    State(s): State<Shared>,
    PathParam(name): PathParam<String>,
) -> Result<StatusCode, Problem> {
    let p = auth.require(Role::Admin)?;
    if let Some(own) = &p.tenant {
        let tokens = access::list(s.engine.pool()).await.map_err(TokenError::from)?;
        if !tokens.iter().any(|t| t.name == name && t.tenant.as_deref() == Some(own)) {
            return Err(TokenError::NotFound(name).into());
        }
    }
    access::revoke(s.engine.pool(), &name).await?;
    Ok(StatusCode::NO_CONTENT)
}

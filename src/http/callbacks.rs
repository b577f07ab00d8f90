//! /v1/callbacks: admins subscribe a portal's URL to job events, list and delete subscriptions.
//! The signing secret is shown once, in the answer to the creation. An admin scoped to a tenant
//! manages that tenant's subscriptions only, and cannot create unscoped ones.

use axum::Json;
use axum::extract::State;
use axum::http::{Method, StatusCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::auth::Auth;
use super::extract::{Body, PathParam};
use super::{Problem, Route, Shared, route};
use crate::domain::names::TenantName;
use crate::engine::{EventType, NewSubscription, SubscriptionError};
use crate::http::access::Role;

pub fn routes() -> Vec<Route> {
    vec![
        route(Method::GET, "/v1/callbacks", list),
        route(Method::POST, "/v1/callbacks", create),
        route(Method::POST, "/v1/callbacks/{id}/delete", delete),
    ]
}

impl From<SubscriptionError> for Problem {
    fn from(e: SubscriptionError) -> Self {
        match e {
            e @ SubscriptionError::BadUrl(_) => Problem::unprocessable(e.to_string()),
            SubscriptionError::Engine(e) => Problem::from(e),
        }
    }
}

async fn list(auth: Auth, State(s): State<Shared>) -> Result<Json<Value>, Problem> {
    let p = auth.require(Role::Admin)?;
    let subs = s.engine.subscriptions().await?;
    let subs: Vec<_> = subs.into_iter().filter(|c| p.tenant.is_none() || c.tenant == p.tenant).collect();
    Ok(Json(json!({ "callbacks": subs })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewCallback {
    url: String,
    tenant: Option<String>,
    events: Option<Vec<String>>,
}

async fn create(
    auth: Auth,
    State(s): State<Shared>,
    Body(b): Body<NewCallback>,
) -> Result<(StatusCode, Json<Value>), Problem> {
    let p = auth.require(Role::Admin)?;
    let tenant =
        b.tenant.as_deref().map(TenantName::parse).transpose().map_err(|e| Problem::unprocessable(e.to_string()))?;
    s.check_scope(p, tenant.as_ref(), |own| {
        format!("this token manages the callbacks of tenant {own} only: set \"tenant\": \"{own}\"")
    })?;
    let events = match b.events {
        None => EventType::DEFAULT.to_vec(),
        Some(names) if names.is_empty() => {
            return Err(Problem::unprocessable("events must name at least one event type, or be left out"));
        }
        Some(names) => {
            let mut events: Vec<EventType> = Vec::new();
            for n in &names {
                let e: EventType = n.parse().map_err(Problem::unprocessable)?;
                if !events.contains(&e) {
                    events.push(e);
                }
            }
            events
        }
    };
    let new = NewSubscription {
        url: b.url,
        tenant: tenant.map(|t| t.as_str().to_string()),
        events,
        created_by: p.actor().as_str().to_string(),
    };
    let (sub, secret) = s.engine.create_subscription(&new).await?;
    let mut body = serde_json::to_value(&sub).map_err(|_| Problem::internal())?;
    body["secret"] = json!(secret.expose());
    Ok((StatusCode::CREATED, Json(body)))
}

async fn delete(auth: Auth, State(s): State<Shared>, PathParam(id): PathParam<i64>) -> Result<StatusCode, Problem> {
    let p = auth.require(Role::Admin)?;
    let not_found = || Problem::not_found(format!("callback subscription {id} not found"));
    if let Some(own) = &p.tenant {
        let subs = s.engine.subscriptions().await?;
        if !subs.iter().any(|c| c.id == id && c.tenant.as_deref() == Some(own.as_str())) {
            return Err(not_found());
        }
    }
    match s.engine.delete_subscription(id).await? {
        true => Ok(StatusCode::NO_CONTENT),
        false => Err(not_found()),
    }
}

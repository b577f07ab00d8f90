//! /v1/deliveries/{id}: a stored webhook delivery (the id of the webhook's 202) and the reconcile
//! jobs the pump made of it. Reconcile jobs are unscoped, so a tenant-scoped token sees no
//! delivery ("not found", as if it did not exist).

use axum::Json;
use axum::extract::State;
use axum::http::Method;

use super::auth::Auth;
use super::extract::PathParam;
use super::{Problem, Route, Shared, route};
use crate::http::access::Role;
use crate::intake::view::{DeliveryView, delivery};

pub fn routes() -> Vec<Route> {
    vec![route(Method::GET, "/v1/deliveries/{id}", show)]
}

async fn show(
    auth: Auth,
    State(s): State<Shared>,
    PathParam(id): PathParam<String>,
) -> Result<Json<DeliveryView>, Problem> {
    let p = auth.require(Role::Viewer)?;
    let not_found = || Problem::not_found(format!("delivery {id} not found"));
    let uuid = uuid::Uuid::parse_str(&id)
        .map_err(|_| Problem::bad_request("a delivery id is a UUID, as the webhook's answer gives it"))?;
    if p.tenant.is_some() {
        return Err(not_found());
    }
    delivery(&s.engine, uuid).await?.map(Json).ok_or_else(not_found)
}

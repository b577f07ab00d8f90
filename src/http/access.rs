//! API tokens and what each role may do. Only a SHA-256 of a token is stored; the token itself is
//! shown once. A token may be scoped to one tenant: it then sees and acts on that tenant only.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use time::OffsetDateTime;

use crate::domain::names::TenantName;
use crate::domain::secret::Secret;
use crate::domain::tenants::TenantRegistry;
use crate::engine::Actor;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Operator,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl FromStr for Role {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "viewer" => Ok(Role::Viewer),
            "operator" => Ok(Role::Operator),
            "admin" => Ok(Role::Admin),
            _ => Err(format!("unknown role {s:?}: admin, operator or viewer")),
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who is calling, once their token checked out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub token_name: String,
    pub role: Role,
    pub tenant: Option<String>,
}

impl Principal {
    pub fn actor(&self) -> Actor {
        Actor::api(&self.token_name)
    }

    /// Whether this principal may see or act on something of `tenant`.
    pub fn sees(&self, tenant: &str) -> bool {
        self.tenant.as_deref().is_none_or(|t| t == tenant)
    }

    /// Whether this principal may see or act on a job of `kind` and `tenant` (its subject's first
    /// segment). A tenant-scoped token sees only jobs of its own tenant, and only when that is a
    /// tenant of the registry: never the reconciler's jobs (they list every tenant's users), nor a
    /// job whose subject names no registry tenant.
    pub fn sees_job(&self, kind: &str, tenant: &str, registry: Option<&TenantRegistry>) -> bool {
        match &self.tenant {
            None => true,
            Some(own) => {
                own == tenant
                    && !kind.starts_with(UNSCOPED_KINDS)
                    && registry.is_some_and(|r| r.tenant(tenant).is_some())
            }
        }
    }
}

/// Jobs of kinds starting with this are seen by unscoped tokens only (`reconcile.*`).
pub const UNSCOPED_KINDS: &str = "reconcile.";

#[derive(Clone, Debug, Serialize, sqlx::FromRow)]
pub struct TokenInfo {
    pub id: i64,
    pub name: String,
    pub role: String,
    pub tenant: Option<String>,
    pub created_by: String,
    #[serde(with = "time::serde::rfc3339")]
    pub created_at: OffsetDateTime,
    #[serde(with = "time::serde::rfc3339::option")]
    pub expires_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub revoked_at: Option<OffsetDateTime>,
    #[serde(with = "time::serde::rfc3339::option")]
    pub last_used_at: Option<OffsetDateTime>,
}

#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("a token named {0:?} exists already")]
    NameTaken(String),
    #[error("token name {0:?} is not allowed: 1 to 64 letters, digits, '.', '_', '-' or '@'")]
    BadName(String),
    #[error("no token named {0:?}")]
    NotFound(String),
    #[error("ONRAMP_API_TOKEN must have at least 24 characters (e.g. openssl rand -hex 24)")]
    Weak,
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
}

fn digest(token: &str) -> Vec<u8> {
    Sha256::digest(token.as_bytes()).to_vec()
}

/// Creates a token and returns it: the only time it is ever seen.
pub async fn create(
    pool: &PgPool,
    name: &str,
    role: Role,
    tenant: Option<&TenantName>,
    expires_at: Option<OffsetDateTime>,
    created_by: &Actor,
) -> Result<Secret, TokenError> {
    let ok =
        !name.is_empty() && name.len() <= 64 && name.chars().all(|c| c.is_ascii_alphanumeric() || "._-@".contains(c));
    if !ok {
        return Err(TokenError::BadName(name.chars().take(80).collect()));
    }
    let token = format!("onr_{}{}", uuid::Uuid::new_v4().simple(), uuid::Uuid::new_v4().simple());
    let res = sqlx::query(
        "insert into api_tokens (name, role, tenant, hash, created_by, expires_at) values ($1, $2, $3, $4, $5, $6)",
    )
    .bind(name)
    .bind(role.as_str())
    .bind(tenant.map(TenantName::as_str))
    .bind(digest(&token))
    .bind(created_by.as_str())
    .bind(expires_at)
    .execute(pool)
    .await;
    match res {
        Ok(_) => Ok(Secret::new(token)),
        Err(sqlx::Error::Database(e)) if e.constraint() == Some("api_tokens_name_key") => {
            Err(TokenError::NameTaken(name.into()))
        }
        Err(e) => Err(e.into()),
    }
}

/// The name of the admin token given by the settings (`ONRAMP_API_TOKEN`); `create` cannot make
/// a token of this name (its `:`).
pub const SETTINGS_TOKEN: &str = "settings:ONRAMP_API_TOKEN";

/// Makes `token` (from the settings) a valid admin token, replacing an earlier one; with `None`,
/// revokes the one an earlier start installed. Idempotent: every API replica runs it at start.
pub async fn install_settings_token(pool: &PgPool, token: Option<&Secret>) -> Result<(), TokenError> {
    let Some(token) = token else {
        sqlx::query("update api_tokens set revoked_at = coalesce(revoked_at, now()) where name = $1")
            .bind(SETTINGS_TOKEN)
            .execute(pool)
            .await?;
        return Ok(());
    };
    if token.expose().len() < 24 {
        return Err(TokenError::Weak);
    }
    // Replicas starting together insert the same row: the one that loses the race on the hash's
    // unique index (not the `on conflict` arbiter) tries again and takes the update path.
    let mut tries = 0;
    loop {
        let r = sqlx::query(
            "insert into api_tokens (name, role, tenant, hash, created_by) values ($1, 'admin', null, $2, 'settings')
             on conflict (name) do update set hash = excluded.hash, role = 'admin', tenant = null,
                 revoked_at = null, expires_at = null",
        )
        .bind(SETTINGS_TOKEN)
        .bind(digest(token.expose()))
        .execute(pool)
        .await;
        tries += 1;
        match r {
            Err(sqlx::Error::Database(e)) if e.is_unique_violation() && tries < 3 => continue,
            r => {
                r?;
                return Ok(());
            }
        }
    }
}

/// The principal behind a presented token, if it is known, unexpired and not revoked.
/// The lookup is by hash, so no comparison of secrets happens in this process.
pub async fn authenticate(pool: &PgPool, token: &str) -> Result<Option<Principal>, sqlx::Error> {
    let row: Option<(String, String, Option<String>)> = sqlx::query_as(
        "update api_tokens set last_used_at = now()
         where hash = $1 and revoked_at is null and (expires_at is null or expires_at > now())
         returning name, role, tenant",
    )
    .bind(digest(token))
    .fetch_optional(pool)
    .await?;
    Ok(row.and_then(|(token_name, role, tenant)| Some(Principal { token_name, role: role.parse().ok()?, tenant })))
}

pub async fn list(pool: &PgPool) -> Result<Vec<TokenInfo>, sqlx::Error> {
    sqlx::query_as(
        "select id, name, role, tenant, created_by, created_at, expires_at, revoked_at, last_used_at
         from api_tokens order by id",
    )
    .fetch_all(pool)
    .await
}

/// Revokes a token by name; it stops working at once.
pub async fn revoke(pool: &PgPool, name: &str) -> Result<(), TokenError> {
    let n = sqlx::query("update api_tokens set revoked_at = coalesce(revoked_at, now()) where name = $1")
        .bind(name)
        .execute(pool)
        .await?
        .rows_affected();
    if n == 0 {
        return Err(TokenError::NotFound(name.into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_order_by_power() {
        assert!(Role::Admin > Role::Operator && Role::Operator > Role::Viewer);
        assert_eq!("operator".parse::<Role>(), Ok(Role::Operator));
        assert!("root".parse::<Role>().is_err());
    }

    #[test]
    fn tenant_scope() {
        let p = Principal { token_name: "t".into(), role: Role::Viewer, tenant: Some("foo".into()) };
        assert!(p.sees("foo") && !p.sees("bar"));
        let all = Principal { tenant: None, ..p.clone() };
        assert!(all.sees("bar"));
        let reg = TenantRegistry::parse("tenants:\n  - { name: foo, group: g }\n", "t").unwrap();
        assert!(p.sees_job("user.onboard", "foo", Some(&reg)));
        assert!(!p.sees_job("reconcile.tenant", "foo", Some(&reg)), "the reconciler's jobs: unscoped only");
        assert!(!p.sees_job("user.onboard", "foo", None), "no registry: no tenant is known");
        let odd = Principal { tenant: Some("reconcile".into()), ..p };
        assert!(!odd.sees_job("reconcile.full", "reconcile", Some(&reg)), "not a registry tenant");
        assert!(all.sees_job("reconcile.full", "reconcile", None));
    }
}

//! Bearer authentication for /v1: the token's principal, role checks, and a limit on failed
//! attempts per source address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};

use super::{AppState, Problem};
use crate::http::access::{self, Principal, Role};

/// Failed authentications allowed per source address and window.
const MAX_FAILURES: u32 = 20;
const WINDOW: Duration = Duration::from_secs(60);

/// Counts failed authentications per source address.
#[derive(Default)]
pub struct AuthLimiter {
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl AuthLimiter {
    fn blocked(&self, ip: IpAddr) -> Option<Duration> {
        let map = self.failures.lock().expect("limiter lock");
        let (since, n) = map.get(&ip)?;
        let left = WINDOW.saturating_sub(since.elapsed());
        (*n >= MAX_FAILURES && !left.is_zero()).then_some(left)
    }

    fn failed(&self, ip: IpAddr) {
        let mut map = self.failures.lock().expect("limiter lock");
        map.retain(|_, (since, _)| since.elapsed() < WINDOW);
        let e = map.entry(ip).or_insert((Instant::now(), 0));
        e.1 += 1;
    }
}

/// The authenticated caller.
pub struct Auth(pub Principal);

impl Auth {
    /// 403 unless the caller's role is at least `role`.
    pub fn require(&self, role: Role) -> Result<&Principal, Problem> {
        if self.0.role >= role {
            Ok(&self.0)
        } else {
            Err(Problem::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "Forbidden",
                format!("this needs the {role} role; the token has {}", self.0.role),
            ))
        }
    }
}

impl FromRequestParts<AppState> for Auth {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Problem> {
        let ip =
            parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()).unwrap_or(IpAddr::from([0, 0, 0, 0]));
        if let Some(left) = state.limiter.blocked(ip) {
            let mut p = Problem::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too-many-failures",
                "Too many failed authentications",
                "too many failed authentications from this address; try again later",
            );
            p.retry_after = Some(left.as_secs().max(1));
            return Err(p);
        }
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or("");
        let principal = if token.is_empty() {
            None
        } else {
            access::authenticate(state.engine.pool(), token).await.map_err(|e| {
                tracing::error!(error = %e, "token lookup failed");
                Problem::internal()
            })?
        };
        match principal {
            Some(p) => Ok(Auth(p)),
            None if token.is_empty() => Err(Problem::unauthorized()),
            None => {
                // only presented credentials that fail count: they are guesses
                state.limiter.failed(ip);
                tracing::warn!(source = %ip, path = %parts.uri.path(), "API authentication failed");
                Err(Problem::unauthorized())
            }
        }
    }
}

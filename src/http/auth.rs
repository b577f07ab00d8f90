//! Bearer authentication for /v1: the token's principal, role checks, and a limit on failed
//! attempts per source. The presented token is always checked first, so a valid one is never
//! refused; only a failing one from a source over its budget is answered 429.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};

use super::{Problem, Shared, source};
use crate::http::access::{self, Principal, Role};

/// Failed authentications allowed per source and window.
const MAX_FAILURES: u32 = 20;
const WINDOW: Duration = Duration::from_secs(60);
/// Most sources remembered; beyond, the oldest is forgotten.
const MAX_SOURCES: usize = 10_000;

/// Counts failed authentications per source.
#[derive(Default)]
pub struct AuthLimiter {
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

impl AuthLimiter {
    /// Counts a failure from `ip`; how long it must wait when it is over its budget.
    fn failed(&self, ip: IpAddr) -> Option<Duration> {
        let mut map = self.failures.lock().expect("limiter lock");
        let now = Instant::now();
        if map.len() >= MAX_SOURCES && !map.contains_key(&ip) {
            map.retain(|_, (since, _)| now.duration_since(*since) < WINDOW);
            if map.len() >= MAX_SOURCES
                && let Some(oldest) = map.iter().min_by_key(|(_, (since, _))| *since).map(|(k, _)| *k)
            {
                map.remove(&oldest);
            }
        }
        let e = map.entry(ip).or_insert((now, 0));
        if now.duration_since(e.0) >= WINDOW {
            *e = (now, 0);
        }
        e.1 += 1;
        let left = WINDOW.saturating_sub(now.duration_since(e.0)).max(Duration::from_secs(1));
        (e.1 > MAX_FAILURES).then_some(left)
    }

    /// Sources remembered now.
    pub fn sources(&self) -> usize {
        self.failures.lock().expect("limiter lock").len()
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

impl FromRequestParts<Shared> for Auth {
    type Rejection = Problem;

    async fn from_request_parts(parts: &mut Parts, state: &Shared) -> Result<Self, Problem> {
        let token = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .unwrap_or("");
        if token.is_empty() {
            return Err(Problem::unauthorized());
        }
        let principal = access::authenticate(state.engine.pool(), token).await.map_err(|e| {
            tracing::error!(error = %e, "token lookup failed");
            Problem::internal()
        })?;
        if let Some(p) = principal {
            return Ok(Auth(p));
        }
        // only presented credentials that fail count: they are guesses
        let peer =
            parts.extensions.get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip()).unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let ip = source::client(peer, &parts.headers, &state.http.trusted_proxies);
        match state.limiter.failed(ip) {
            None => {
                tracing::warn!(source = %ip, path = %parts.uri.path(), "API authentication failed");
                Err(Problem::unauthorized())
            }
            Some(left) => {
                tracing::debug!(source = %ip, "API authentication failed again from a source over its budget");
                let mut p = Problem::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too-many-failures",
                    "Too many failed authentications",
                    "too many failed authentications from this address; try again later",
                );
                p.retry_after = Some(left.as_secs().max(1));
                Err(p)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_is_per_source_and_memory_is_bounded() {
        let l = AuthLimiter::default();
        let a = IpAddr::from([192, 0, 2, 1]);
        for _ in 0..MAX_FAILURES {
            assert_eq!(l.failed(a), None);
        }
        assert!(l.failed(a).is_some_and(|left| left <= WINDOW));
        assert_eq!(l.failed(IpAddr::from([192, 0, 2, 2])), None, "another source has its own budget");
        for i in 0..(MAX_SOURCES as u32 + 500) {
            l.failed(IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
        }
        assert!(l.sources() <= MAX_SOURCES, "{}", l.sources());
    }
}

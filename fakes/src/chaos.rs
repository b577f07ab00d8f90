//! Rate-based chaos, shared by the fakes: while a [`ChaosSpec`] is set, every API request whose
//! path matches fails with probability `rate`, with a kind drawn from `kinds` (those that fit the
//! request: `drop_exec` only for an exec). Control requests (`/_fake/…`) never fail. What was
//! injected is counted by kind and listed, so a test can report it and compare it with what the
//! client made of it.
//!
//! The draws come from a generator seeded by `seed` (splitmix64), so one request order gives one
//! sequence of faults; concurrent clients make the order, and so the exact faults, vary.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// A kind of fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize, Serialize)]
pub enum ChaosKind {
    /// 500, 502 or 503 with the API's error body.
    #[serde(rename = "5xx")]
    ServerError,
    /// 429 with `Retry-After: retry_after` (and the Status body's `retryAfterSeconds`).
    #[serde(rename = "429")]
    TooManyRequests,
    /// The answer comes `delay_ms` late (beyond the client's timeout); the request still takes
    /// effect then, as a slow server's would.
    #[serde(rename = "timeout")]
    Timeout,
    /// Exec only: the first output is sent, then the connection is dropped without a status.
    #[serde(rename = "drop_exec")]
    DropExec,
}

impl ChaosKind {
    pub fn name(self) -> &'static str {
        match self {
            Self::ServerError => "5xx",
            Self::TooManyRequests => "429",
            Self::Timeout => "timeout",
            Self::DropExec => "drop_exec",
        }
    }
}

/// What `POST /_fake/chaos` takes.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ChaosSpec {
    /// Share of matching requests that fail, 0..=1.
    pub rate: f64,
    #[serde(default)]
    pub seed: u64,
    pub kinds: Vec<ChaosKind>,
    /// Parts of the path (with the query) a request must contain one of; empty: every request.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub paths: Vec<String>,
    /// `Retry-After` of a 429, in seconds.
    #[serde(default = "one")]
    pub retry_after: u32,
    /// How late a `timeout` answers.
    #[serde(default = "five_seconds")]
    pub delay_ms: u64,
}

fn one() -> u32 {
    1
}

fn five_seconds() -> u64 {
    5000
}

impl ChaosSpec {
    pub fn check(&self) -> Result<(), String> {
        if !(0.0..=1.0).contains(&self.rate) {
            return Err(format!("rate {} is not between 0 and 1", self.rate));
        }
        if self.kinds.is_empty() {
            return Err("kinds is empty".into());
        }
        Ok(())
    }
}

/// One injected fault.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Injected {
    /// Milliseconds since the Unix epoch.
    pub at_ms: u64,
    pub method: String,
    pub path: String,
    pub kind: ChaosKind,
    /// The status answered (5xx, 429), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

/// What `GET /_fake/chaos` answers.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ChaosReport {
    pub spec: Option<ChaosSpec>,
    /// Requests that matched the spec's paths while it was set.
    pub matched: u64,
    /// Injected faults by kind name.
    pub injected: BTreeMap<String, u64>,
    pub events: Vec<Injected>,
}

/// The fault chosen for one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Status { code: u16, retry_after: Option<u32> },
    Delay(Duration),
    DropExec,
}

/// A fake's chaos state.
#[derive(Default)]
pub struct Chaos {
    report: ChaosReport,
    state: u64,
}

impl Chaos {
    /// Sets (or with `None` clears) the spec; the counts start again.
    pub fn set(&mut self, spec: Option<ChaosSpec>) {
        self.state = spec.as_ref().map_or(0, |s| s.seed);
        self.report = ChaosReport { spec, ..Default::default() };
    }

    pub fn report(&self) -> ChaosReport {
        self.report.clone()
    }

    /// splitmix64: a uniform draw from [0, 1).
    fn draw(&mut self) -> f64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Whether this API request fails, and how (`exec`: the request is an exec).
    pub fn decide(&mut self, method: &str, path: &str, exec: bool) -> Option<Decision> {
        let spec = self.report.spec.clone()?;
        if !spec.paths.is_empty() && !spec.paths.iter().any(|p| path.contains(p.as_str())) {
            return None;
        }
        self.report.matched += 1;
        let fits: Vec<ChaosKind> = spec.kinds.iter().copied().filter(|k| exec || *k != ChaosKind::DropExec).collect();
        if fits.is_empty() || self.draw() >= spec.rate {
            return None;
        }
        let kind = fits[((self.draw() * fits.len() as f64) as usize).min(fits.len() - 1)];
        let decision = match kind {
            ChaosKind::ServerError => {
                Decision::Status { code: [500, 502, 503][(self.draw() * 3.0) as usize % 3], retry_after: None }
            }
            ChaosKind::TooManyRequests => Decision::Status { code: 429, retry_after: Some(spec.retry_after) },
            ChaosKind::Timeout => Decision::Delay(Duration::from_millis(spec.delay_ms)),
            ChaosKind::DropExec => Decision::DropExec,
        };
        let at_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        let status = match decision {
            Decision::Status { code, .. } => Some(code),
            _ => None,
        };
        *self.report.injected.entry(kind.name().to_string()).or_default() += 1;
        self.report.events.push(Injected { at_ms, method: method.into(), path: path.into(), kind, status });
        Some(decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rate: f64, kinds: Vec<ChaosKind>) -> ChaosSpec {
        ChaosSpec { rate, seed: 7, kinds, paths: vec![], retry_after: 2, delay_ms: 10 }
    }

    #[test]
    fn the_rate_holds_and_the_kinds_fit_the_request() {
        let mut c = Chaos::default();
        c.set(Some(spec(0.2, vec![ChaosKind::ServerError, ChaosKind::DropExec])));
        let hits = (0..10_000).filter(|_| c.decide("GET", "/api/v1/x", false).is_some()).count();
        assert!((1_700..2_300).contains(&hits), "{hits} of 10000");
        let r = c.report();
        assert_eq!((r.matched, r.injected.get("drop_exec")), (10_000, None));
        assert_eq!(r.injected["5xx"] as usize, hits);
    }

    #[test]
    fn one_seed_one_sequence_and_paths_select() {
        let run = || {
            let mut c = Chaos::default();
            let mut s = spec(0.5, vec![ChaosKind::TooManyRequests, ChaosKind::Timeout]);
            s.paths = vec!["secrets".into()];
            c.set(Some(s));
            assert_eq!(c.decide("GET", "/api/v1/pods", false), None);
            (0..50).map(|_| c.decide("GET", "/api/v1/secrets/a", false)).collect::<Vec<_>>()
        };
        assert_eq!(run(), run());
        assert!(run().contains(&Some(Decision::Status { code: 429, retry_after: Some(2) })));
    }
}

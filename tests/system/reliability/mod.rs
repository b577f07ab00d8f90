//! The reliability suite (RELIABILITY.md): scenarios on the system test's world in which things
//! fail — processes killed with `kill -9`, PostgreSQL restarted, backends failing a share of their
//! calls, gates tried, every process doubled — and afterwards everything acknowledged is shown to
//! have been carried out exactly as if nothing had failed: every effect once, in order, no gate
//! skipped. Each scenario counts what it checked and prints one `reliability:` line of figures
//! (run with `--nocapture` to see them); RELIABILITY.md holds the last run's.
//!
//! Sized to minutes in `.ci/run`; `ONRAMP_RELIABILITY_FULL=1` runs the sizes RELIABILITY.md
//! reports (e.g. 1,000 users, 20 kills).

mod chaos;
mod crash;
mod faults;
mod gates;
mod postgres;
mod whose;

use std::fmt::Write as _;
use std::time::Instant;

/// Whether the long mode runs (`ONRAMP_RELIABILITY_FULL=1`).
pub fn full() -> bool {
    std::env::var("ONRAMP_RELIABILITY_FULL").is_ok_and(|v| v == "1")
}

/// A scenario's figures, printed as one line when it ends: `reliability: <scenario>: k=v, …`.
pub struct Figures {
    scenario: &'static str,
    started: Instant,
    figures: Vec<(String, String)>,
}

impl Figures {
    pub fn new(scenario: &'static str) -> Self {
        Self { scenario, started: Instant::now(), figures: vec![] }
    }

    pub fn add(&mut self, name: &str, value: impl std::fmt::Display) {
        self.figures.push((name.to_string(), value.to_string()));
    }

    /// Prints the figures with the time since `new`.
    pub fn print(&self) {
        let mut line = format!("reliability: {}:", self.scenario);
        for (k, v) in &self.figures {
            let _ = write!(line, " {k}={v},");
        }
        let _ = write!(line, " seconds={:.0}", self.started.elapsed().as_secs_f64());
        eprintln!("{line}");
    }
}

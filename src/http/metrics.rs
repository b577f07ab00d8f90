//! Prometheus text metrics: the worker's counters and the unfinished jobs by state.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use axum::extract::State;
use axum::http::{Method, header};
use axum::response::IntoResponse;

use super::{Problem, Route, Shared, route};
use crate::engine::JobState;

pub fn routes() -> Vec<Route> {
    vec![route(Method::GET, "/metrics", metrics)]
}

async fn metrics(State(s): State<Shared>) -> Result<impl IntoResponse, Problem> {
    let st = &s.stats;
    let mut out = String::new();
    for (name, help, v) in [
        ("onramp_steps_claimed_total", "Steps claimed by this process.", &st.claimed),
        ("onramp_steps_done_total", "Steps that finished with done.", &st.steps_done),
        ("onramp_steps_retried_total", "Step attempts that asked for a retry.", &st.steps_retried),
        ("onramp_steps_failed_total", "Step attempts that failed permanently.", &st.steps_failed),
        ("onramp_leases_lost_total", "Running steps stopped because their lease was lost.", &st.leases_lost),
        ("onramp_results_refused_total", "Step results refused by attempt fencing.", &st.reclaimed_writes_refused),
        ("onramp_db_errors_total", "Database errors seen by the worker.", &st.db_errors),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}", v.load(Relaxed));
    }
    if let Some(intake) = &s.intake {
        intake.stats.render(&mut out);
        let pending = crate::intake::pump::pending(&s.engine).await?;
        intake.pump.render(&mut out, Some(pending));
    }
    let rows = s.engine.open_by_state().await?;
    let _ = writeln!(out, "# HELP onramp_jobs_open Unfinished jobs by state.\n# TYPE onramp_jobs_open gauge");
    for state in JobState::ALL.into_iter().filter(|st| !st.is_closed()) {
        let n = rows.iter().find(|(st, _)| *st == state).map_or(0, |r| r.1);
        let _ = writeln!(out, "onramp_jobs_open{{state=\"{state}\"}} {n}");
    }
    Ok(([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], out))
}

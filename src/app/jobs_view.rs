//! `onramp jobs list` and `onramp jobs show` for people: a table with a header and the reason a
//! job is where it is; one job as its header, its steps with their attempts, outcomes, errors and
//! effects, and its audit trail. `--json` prints the records instead.

use std::fmt::Write as _;

use time::OffsetDateTime;
use time::macros::format_description;

use crate::engine::{Job, JobEvent, JobState, StepRun};

/// Why the job is where it is, in a few words; empty when there is nothing to say.
pub fn reason(j: &Job) -> String {
    let error = j.last_error.as_deref().map(one_line).unwrap_or_default();
    match j.state {
        JobState::NeedsApproval => format!("waiting for approval: {error}").trim_end_matches([' ', ':']).to_string(),
        JobState::Failed => error,
        JobState::Waiting if error.is_empty() => format!("waits until {}", clock(j.run_at)),
        JobState::Pending | JobState::Running | JobState::Waiting if !error.is_empty() && j.attempt > 1 => {
            format!("retrying: {error}")
        }
        _ => String::new(),
    }
}

/// The newest jobs as a table: a header row, then one row per job.
pub fn list(jobs: &[Job], now: OffsetDateTime) -> String {
    let mut rows = vec![["ID", "STATE", "KIND", "SUBJECT", "STEP", "AGE", "REASON"].map(String::from).to_vec()];
    for j in jobs {
        rows.push(vec![
            j.id.to_string(),
            j.state.to_string(),
            j.kind.clone(),
            j.subject.clone(),
            if j.attempt > 1 { format!("{} (attempt {})", j.step, j.attempt) } else { j.step.clone() },
            age(now, j.created_at),
            shorten(&reason(j), 100),
        ]);
    }
    let mut out = table(&rows);
    if jobs.is_empty() {
        out.push_str("(no jobs)\n");
    }
    out
}

/// One job: what it is, where it stands, each step's attempts with their effects, the audit trail.
pub fn show(j: &Job, runs: &[StepRun], events: &[JobEvent], now: OffsetDateTime) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "job {} · {} · {}", j.id, j.kind, j.subject);
    let mut state = j.state.to_string();
    if j.state != JobState::Succeeded {
        let _ = write!(state, " at step {}", j.step);
        if j.attempt > 0 {
            let _ = write!(state, " (attempt {})", j.attempt);
        }
    }
    let later = matches!(j.state, JobState::Waiting | JobState::Pending) && j.run_at > now;
    if later {
        let _ = write!(state, ", runs again at {} (in {})", stamp(j.run_at), span(j.run_at - now));
    }
    let mut head = vec![("state", state)];
    head.push(("created", format!("{} by {} ({} ago)", stamp(j.created_at), j.created_by, age(now, j.created_at))));
    if let Some(f) = j.finished_at {
        head.push(("finished", format!("{} (took {})", stamp(f), span(f - j.created_at))));
    }
    if let Some(by) = &j.approved_by {
        head.push(("approved by", by.clone()));
    }
    let why = reason(j);
    // a timer's reason is the state line's "runs again at"
    if !(why.is_empty() || (later && j.last_error.is_none())) {
        head.push(("reason", why));
    } else if let Some(e) = &j.last_error {
        head.push(("last error", one_line(e)));
    }
    if j.input.as_object().is_some_and(|m| !m.is_empty()) {
        head.push(("input", j.input.to_string()));
    }
    for (k, v) in head {
        let _ = writeln!(o, "{:<12} {v}", format!("{k}:"));
    }

    let _ = writeln!(o, "\nsteps ({} attempts)", runs.len());
    if runs.is_empty() {
        o.push_str("  (none run yet)\n");
    }
    for r in runs {
        let outcome = r.outcome.map_or("running".to_string(), |x| x.to_string());
        let took = r.finished_at.map(|f| span(f - r.started_at)).unwrap_or_default();
        let _ = writeln!(
            o,
            "  {:>2}. {:<22} attempt {:<3} {:<14} {} {:>6}  {}",
            r.step_index + 1,
            r.step,
            r.attempt,
            outcome,
            clock(r.started_at),
            took,
            r.worker
        );
        if let Some(e) = &r.error {
            let _ = writeln!(o, "        error: {}", one_line(e));
        }
        if let Some(next) = r.next_run_at {
            let _ = writeln!(o, "        runs again at {}", clock(next));
        }
        for e in r.effects.as_ref().and_then(|v| v.as_array()).into_iter().flatten() {
            let write = if e["write"].as_bool() == Some(true) { "+" } else { " " };
            let (system, call) = (e["system"].as_str().unwrap_or("?"), e["call"].as_str().unwrap_or(""));
            let _ = writeln!(o, "        {write} {system:<14} {}", one_line(call));
        }
    }

    let _ = writeln!(o, "\naudit trail");
    for e in events {
        let from = e.from_state.map(|s| format!("{s} → ")).unwrap_or_default();
        let step = e.step.as_deref().map(|s| format!(" (step {s})")).unwrap_or_default();
        let detail = e.detail.as_deref().map(|d| format!(": {}", one_line(d))).unwrap_or_default();
        let _ = writeln!(o, "  {}  {from}{}{step} by {}{detail}", stamp(e.at), e.to_state, e.actor);
    }
    o.push_str("\n(--json prints the job, its attempts and its audit trail in full)\n");
    o
}

/// Columns padded to their widest cell; the last column is not padded.
fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..cols).map(|c| rows.iter().filter_map(|r| r.get(c)).map(|s| s.chars().count()).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ", w = widths[c]);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Errors and commands can span lines; a table row cannot.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn shorten(s: &str, max: usize) -> String {
    if s.chars().count() <= max { s.to_string() } else { format!("{}…", s.chars().take(max - 1).collect::<String>()) }
}

fn stamp(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    t.format(format_description!("[year]-[month]-[day] [hour]:[minute]:[second] UTC")).unwrap_or_default()
}

fn clock(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    t.format(format_description!("[hour]:[minute]:[second]")).unwrap_or_default()
}

/// How long ago, in the largest unit that fits: 5s, 3m, 2h, 4d.
pub fn age(now: OffsetDateTime, t: OffsetDateTime) -> String {
    span(now - t)
}

fn span(d: time::Duration) -> String {
    let s = d.whole_seconds().max(0);
    match s {
        0..10 => format!("{:.1}s", d.as_seconds_f64().max(0.0)).replace(".0s", "s"),
        10..60 => format!("{s}s"),
        60..3600 => format!("{}m", s / 60),
        3600..86400 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use time::macros::datetime;

    fn job(id: i64, state: JobState, error: Option<&str>, attempt: i32) -> Job {
        let created = datetime!(2026-01-02 10:00:00 UTC);
        Job {
            id,
            kind: "user.onboard".into(),
            subject: "demo/alice".into(),
            tenant: "demo".into(),
            dedupe_key: None,
            state,
            input: json!({ "tenant": "demo", "user": "alice" }),
            outputs: json!({}),
            step_index: 1,
            step: "associate".into(),
            attempt,
            run_at: datetime!(2026-01-02 10:05:00 UTC),
            lease_owner: None,
            poll_deadline: None,
            approved_by: None,
            last_error: error.map(String::from),
            created_by: "cli:alice".into(),
            created_at: created,
            updated_at: created,
            finished_at: None,
        }
    }

    #[test]
    fn the_reason_says_why_a_job_is_where_it_is() {
        let approval = job(1, JobState::NeedsApproval, Some("hard cutoff: 3 jobs\nstill running"), 1);
        assert_eq!(reason(&approval), "waiting for approval: hard cutoff: 3 jobs still running");
        assert_eq!(
            reason(&job(2, JobState::Failed, Some("sacctmgr: no such account"), 5)),
            "sacctmgr: no such account"
        );
        assert_eq!(reason(&job(3, JobState::Pending, Some("timeout"), 3)), "retrying: timeout");
        assert_eq!(reason(&job(4, JobState::Waiting, None, 1)), "waits until 10:05:00");
        assert_eq!(reason(&job(5, JobState::Succeeded, Some("an old retry"), 2)), "");
    }

    #[test]
    fn the_list_has_a_header_and_aligned_columns() {
        let now = datetime!(2026-01-02 12:00:00 UTC);
        let jobs = [job(12, JobState::Failed, Some("boom"), 3), job(7, JobState::Succeeded, None, 1)];
        let text = list(&jobs, now);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert!(lines[0].starts_with("ID  STATE") && lines[0].ends_with("REASON"), "{text}");
        let col = |l: &str| l.find("user.onboard").unwrap();
        assert_eq!(col(lines[1]), col(lines[2]), "{text}");
        assert!(lines[1].contains("associate (attempt 3)") && lines[1].ends_with("2h   boom"), "{text}");
        assert_eq!(list(&[], now).lines().nth(1), Some("(no jobs)"));
    }

    #[test]
    fn show_reads_as_steps_attempts_and_effects() {
        let mut j = job(9, JobState::Failed, Some("sacctmgr failed"), 2);
        j.finished_at = Some(datetime!(2026-01-02 10:01:30 UTC));
        let run = |attempt: i32, outcome, error: Option<&str>, effects| StepRun {
            id: attempt.into(),
            job_id: 9,
            step_index: 1,
            step: "associate".into(),
            attempt,
            worker: "w1".into(),
            started_at: datetime!(2026-01-02 10:01:00 UTC),
            finished_at: Some(datetime!(2026-01-02 10:01:02 UTC)),
            outcome: Some(outcome),
            error: error.map(String::from),
            output: None,
            next_run_at: None,
            effects,
        };
        let effects = json!([{ "system": "slurm", "call": "sacctmgr -i add user alice", "write": true }]);
        let runs = [
            run(1, crate::engine::StepOutcome::Retry, Some("timeout"), None),
            run(2, crate::engine::StepOutcome::Fail, Some("sacctmgr failed"), Some(effects)),
        ];
        let text = show(&j, &runs, &[], datetime!(2026-01-02 12:00:00 UTC));
        assert!(
            text.starts_with("job 9 · user.onboard · demo/alice\nstate:       failed at step associate (attempt 2)")
        );
        assert!(text.contains("reason:      sacctmgr failed"), "{text}");
        assert!(text.contains("finished:    2026-01-02 10:01:30 UTC (took 1m)"), "{text}");
        assert!(
            text.contains(
                "   2. associate              attempt 1   retry          10:01:00     2s  w1\n        error: timeout"
            ),
            "{text}"
        );
        assert!(text.contains("        + slurm          sacctmgr -i add user alice"), "{text}");
    }
}

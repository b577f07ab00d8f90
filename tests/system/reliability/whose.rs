//! When users lack their association at the end of a crash scenario: everything known about
//! them (their jobs, each attempt with its effects, every `sacctmgr` call naming them and the
//! writes around those), so a lost write can be told from a wrong delete.

use std::fmt::Write;

use crate::world::World;
use crate::world::cluster::{self, User};
use crate::world::trace::SacctmgrTrace;

/// An attempt: step, attempt, worker, started, finished, outcome, effects.
type Run = (String, i32, String, Option<String>, Option<String>, Option<String>, Option<String>);

/// The staying users without an association under their account (tenant or team account).
pub fn missing(w: &World, staying: &[User]) -> Vec<User> {
    let mut accounts: Vec<&str> = w.tenants.iter().map(|t| t.account.as_str()).collect();
    accounts.extend(w.tenants.iter().filter_map(|t| t.team.as_ref().map(|(a, _)| a.as_str())));
    let rows = cluster::assocs(&accounts);
    staying.iter().filter(|u| !rows.iter().any(|r| r.user == u.username && r.account == u.account)).cloned().collect()
}

/// A report on these users; the trace is copied into the world's directory (kept on failure).
pub async fn report(w: &World, users: &[User], trace: &SacctmgrTrace) -> String {
    let kept = w.path("sacctmgr.jsonl");
    let _ = std::fs::copy(&trace.log, &kept);
    let mut out = format!("the full sacctmgr trace: {}\n", kept.display());
    let calls = trace.calls();
    for u in users {
        let _ = writeln!(out, "\n== {} ({}, account {})", u.username, u.tenant, u.account);
        let jobs: Vec<(i64, String, String, String, String)> = sqlx::query_as(
            "select id, kind, subject, state, outputs::text from jobs
             where input->>'username' = $1 or subject like '%' || $1 || '%' order by id",
        )
        .bind(&u.username)
        .fetch_all(&w.db.pool)
        .await
        .unwrap();
        for (id, kind, subject, state, outputs) in jobs {
            let _ = writeln!(out, "job {id} {kind} {subject} {state} outputs={outputs}");
            let runs: Vec<Run> = sqlx::query_as(
                "select step, attempt, worker, to_char(started_at, 'HH24:MI:SS.MS'),
                            to_char(finished_at, 'HH24:MI:SS.MS'), outcome, effects::text
                     from step_runs where job_id = $1 order by id",
            )
            .bind(id)
            .fetch_all(&w.db.pool)
            .await
            .unwrap();
            for (step, attempt, worker, start, end, outcome, effects) in runs {
                let _ = writeln!(
                    out,
                    "  {step}#{attempt} {worker} {start:?}..{end:?} {outcome:?} effects={}",
                    effects.unwrap_or_default()
                );
            }
        }
        let named: Vec<_> = calls.iter().filter(|c| c.argv.iter().any(|a| names(a, &u.username))).collect();
        for c in &named {
            let _ =
                writeln!(out, "sacctmgr ppid={} {:.3}..{:?} code={:?} {:?}", c.ppid, c.start, c.end, c.code, c.argv);
            // the writes that ran within two seconds of it
            for o in calls.iter().filter(|o| o.writes() && (o.start - c.start).abs() < 2.0 && o.start != c.start) {
                let _ = writeln!(
                    out,
                    "   near: ppid={} {:.3}..{:?} code={:?} {:?}",
                    o.ppid, o.start, o.end, o.code, o.argv
                );
            }
        }
    }
    out
}

/// `arg` names `user`: alone, in a comma list, or as `name=user`.
fn names(arg: &str, user: &str) -> bool {
    arg.split(['=', ',']).any(|p| p == user)
}

//! Reading Slurm's answers: `-n -P` rows into typed values, and exit code plus text into an
//! outcome ("already exists", "nothing modified", "nothing deleted" are outcomes, not errors).

use std::collections::BTreeMap;

use super::error::SlurmError;
use super::types::{AccountState, Association, SlurmJob, SlurmJobState};
use super::values::{Fairshare, Limit, Tres};
use crate::backends::exec::Output;

/// The association fields every read asks for, in this order.
pub const ASSOC_FORMAT: &str = "cluster,account,user,partition,parentname,share,grpjobs,grpsubmit,grptres,grptresmins,maxjobs,maxsubmit,qos,defaultqos";
const ASSOC_FIELDS: usize = 14;
/// `squeue -o`: job id, user, account, state, reason.
pub const SQUEUE_FORMAT: &str = "%i|%u|%a|%T|%r";

/// How a write that sacctmgr accepted or politely declined ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Done,
    /// `Nothing new added.`: it exists already.
    Exists,
    /// `Nothing modified`: no such association.
    NothingModified,
    /// `Nothing deleted`: already gone.
    NothingDeleted,
}

/// Classifies a finished command: an error for every failure, else what happened.
pub fn outcome(cmd: &str, out: &Output) -> Result<Outcome, SlurmError> {
    let text = format!("{}\n{}", out.stderr, out.stdout);
    let quoted = |after: &str| -> Option<String> {
        let rest = &text[text.find(after)? + after.len()..];
        let rest = rest.strip_prefix('\'')?;
        Some(rest[..rest.find('\'')?].to_string())
    };
    let detail = || first_lines(&text);
    if is_unreachable(&text) {
        return Err(SlurmError::Unreachable { cmd: cmd.into(), detail: detail() });
    }
    if text.contains("Job(s) active") {
        return Err(SlurmError::JobsActive { what: cmd.into(), jobs: job_ids_in(&text) });
    }
    if let Some(parent) = quoted("Parent account ") {
        return Err(SlurmError::MissingParent(parent));
    }
    if let Some(account) = quoted("This account ") {
        return Err(SlurmError::MissingAccount(account));
    }
    if let Some(account) = quoted("associated with new default account ") {
        return Err(SlurmError::MissingAccount(account));
    }
    if text.contains("no TRES known") {
        return Err(SlurmError::UnknownTres { cmd: cmd.into(), detail: detail() });
    }
    if text.contains("bad qos") || text.contains("bad default qos") {
        return Err(SlurmError::UnknownQos { cmd: cmd.into(), detail: detail() });
    }
    if text.contains("Invalid user") {
        return Err(SlurmError::UnknownUnixUser { cmd: cmd.into(), detail: detail() });
    }
    if out.code == 0 {
        return Ok(Outcome::Done);
    }
    for (said, o) in [
        ("Nothing new added", Outcome::Exists),
        ("Nothing modified", Outcome::NothingModified),
        ("Nothing deleted", Outcome::NothingDeleted),
    ] {
        if text.contains(said) {
            return Ok(o);
        }
    }
    Err(SlurmError::Failed { cmd: cmd.into(), code: out.code, detail: detail() })
}

/// A read: rc 0 with the rows on stdout, or an error. squeue prints unknown users on stderr
/// with rc 0; that is an error too.
pub fn read_ok<'a>(cmd: &str, out: &'a Output) -> Result<&'a str, SlurmError> {
    let text = format!("{}\n{}", out.stderr, out.stdout);
    if is_unreachable(&text) {
        return Err(SlurmError::Unreachable { cmd: cmd.into(), detail: first_lines(&text) });
    }
    if out.stderr.contains("Invalid user") {
        return Err(SlurmError::UnknownUnixUser { cmd: cmd.into(), detail: first_lines(&out.stderr) });
    }
    if out.code != 0 {
        return Err(SlurmError::Failed { cmd: cmd.into(), code: out.code, detail: first_lines(&text) });
    }
    Ok(&out.stdout)
}

fn is_unreachable(text: &str) -> bool {
    [
        "Unable to contact slurm controller",
        "persistent connection",
        "Problem talking to the database",
        "Connection refused",
        "Socket timed out",
        "Unable to establish control machine address",
    ]
    .iter()
    .any(|s| text.contains(s))
}

fn first_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).take(3).collect();
    lines.join(" / ")
}

/// `JobID = 8 …` lines of a refused delete.
fn job_ids_in(text: &str) -> Vec<String> {
    text.split("JobID = ").skip(1).filter_map(|s| s.split_whitespace().next()).map(str::to_string).collect()
}

fn bad(cmd: &str, line: &str, why: impl Into<String>) -> SlurmError {
    SlurmError::Parse { cmd: cmd.into(), line: line.into(), why: why.into() }
}

fn limit(cmd: &str, line: &str, s: &str) -> Result<Limit, SlurmError> {
    if s.is_empty() {
        return Ok(Limit::Unlimited);
    }
    s.parse().map(Limit::At).map_err(|_| bad(cmd, line, format!("{s:?} is not a count")))
}

fn fairshare(cmd: &str, line: &str, s: &str) -> Result<Fairshare, SlurmError> {
    if s.eq_ignore_ascii_case("parent") {
        return Ok(Fairshare::Parent);
    }
    s.parse().map(Fairshare::Shares).map_err(|_| bad(cmd, line, format!("{s:?} is not a fairshare")))
}

fn tres(cmd: &str, line: &str, s: &str) -> Result<Tres, SlurmError> {
    Tres::parse(s).map_err(|e| bad(cmd, line, e.to_string()))
}

/// One association from its [`ASSOC_FORMAT`] fields.
fn assoc(cmd: &str, line: &str, f: &[&str]) -> Result<Association, SlurmError> {
    if f.len() != ASSOC_FIELDS {
        return Err(bad(cmd, line, format!("expected {ASSOC_FIELDS} fields, got {}", f.len())));
    }
    let mut qos: Vec<String> = f[12].split(',').filter(|q| !q.is_empty()).map(str::to_string).collect();
    qos.sort();
    Ok(Association {
        cluster: f[0].into(),
        account: f[1].into(),
        user: f[2].into(),
        partition: f[3].into(),
        parent: f[4].into(),
        fairshare: fairshare(cmd, line, f[5])?,
        grp_jobs: limit(cmd, line, f[6])?,
        grp_submit_jobs: limit(cmd, line, f[7])?,
        grp_tres: tres(cmd, line, f[8])?,
        grp_tres_mins: tres(cmd, line, f[9])?,
        max_jobs: limit(cmd, line, f[10])?,
        max_submit_jobs: limit(cmd, line, f[11])?,
        qos,
        default_qos: f[13].into(),
    })
}

fn rows(stdout: &str) -> impl Iterator<Item = (&str, Vec<&str>)> {
    stdout.lines().filter(|l| !l.trim().is_empty()).map(|l| (l, l.split('|').collect()))
}

/// `sacctmgr -n -P show assoc … format=ASSOC_FORMAT`.
pub fn assocs(cmd: &str, stdout: &str) -> Result<Vec<Association>, SlurmError> {
    rows(stdout).map(|(line, f)| assoc(cmd, line, &f)).collect()
}

/// `sacctmgr -n -P show account … withassoc format=descr,org,ASSOC_FORMAT`.
pub fn accounts(cmd: &str, stdout: &str) -> Result<Vec<AccountState>, SlurmError> {
    rows(stdout)
        .map(|(line, f)| {
            if f.len() != ASSOC_FIELDS + 2 {
                return Err(bad(cmd, line, format!("expected {} fields, got {}", ASSOC_FIELDS + 2, f.len())));
            }
            Ok(AccountState { description: f[0].into(), organization: f[1].into(), assoc: assoc(cmd, line, &f[2..])? })
        })
        .collect()
}

/// `sacctmgr -n -P show user … withassoc format=defaultaccount,ASSOC_FORMAT`: per row the
/// user's default account and one association.
pub fn user_assocs(cmd: &str, stdout: &str) -> Result<Vec<(String, Association)>, SlurmError> {
    rows(stdout)
        .map(|(line, f)| {
            if f.len() != ASSOC_FIELDS + 1 {
                return Err(bad(cmd, line, format!("expected {} fields, got {}", ASSOC_FIELDS + 1, f.len())));
            }
            Ok((f[0].to_string(), assoc(cmd, line, &f[1..])?))
        })
        .collect()
}

/// `squeue -h -o SQUEUE_FORMAT`.
pub fn jobs(cmd: &str, stdout: &str) -> Result<Vec<SlurmJob>, SlurmError> {
    rows(stdout)
        .map(|(line, f)| {
            let [id, user, account, state, reason] = f[..] else {
                return Err(bad(cmd, line, "expected 5 fields"));
            };
            let state = match state {
                "PENDING" => SlurmJobState::Pending,
                "RUNNING" => SlurmJobState::Running,
                "SUSPENDED" => SlurmJobState::Suspended,
                "COMPLETING" => SlurmJobState::Completing,
                "CONFIGURING" => SlurmJobState::Configuring,
                other => SlurmJobState::Other(other.to_string()),
            };
            Ok(SlurmJob { id: id.into(), user: user.into(), account: account.into(), state, reason: reason.into() })
        })
        .collect()
}

/// `scontrol show config`: `Key = value` lines; `(null)` reads as empty. Keys keep their case.
pub fn config(stdout: &str) -> BTreeMap<String, String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| {
            let v = v.trim();
            (k.trim().to_string(), if v == "(null)" { String::new() } else { v.to_string() })
        })
        .collect()
}

/// `cgroup.conf`: `Key=Value` lines, comments after `#`; keys lower-cased.
pub fn cgroup_conf(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;

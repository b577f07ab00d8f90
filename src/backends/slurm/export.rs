//! What stays on record: a scope's accounting records exported with `sacct` to a file on the
//! Slurm host (read back by checksum and row count, and re-read before anything is deleted), how
//! many records sacct shows now, and whether the accounting database still has a user record.
//!
//! The export is one constant shell script with its inputs as positional arguments (`sh -c
//! SCRIPT sh PATH sacct ARGS…`): sacct writes to `PATH.tmp`, which is renamed over `PATH` only when
//! sacct succeeded, so the file is never half written. The read-back (`sha256sum`, `wc -l`) needs
//! no shell.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::client::SlurmCli;
use super::parse;
use super::{HostPath, JobScope, SlurmError};
use crate::backends::exec::Command;
use crate::domain::names::{ClusterName, SlurmAccount, Username};

/// sacct's fields in an export, in this order (no free text such as job names: one line per record).
pub const SACCT_FIELDS: &str =
    "JobID,User,Account,Partition,QOS,State,ExitCode,Submit,Start,End,Elapsed,CPUTimeRAW,AllocTRES,NodeList";

/// Writes the output of the command after the path to the path, atomically; inputs are `$1…`.
pub const EXPORT_SCRIPT: &str = r#"out=$1; shift; tmp="$out.tmp"; umask 077; "$@" > "$tmp" || { rc=$?; rm -f -- "$tmp"; exit "$rc"; }; mv -f -- "$tmp" "$out""#;

/// An export as written and read back on the Slurm host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordsExport {
    pub path: String,
    pub sha256: String,
    /// Data rows (one per job and per step), the header line not counted.
    pub rows: u64,
}

/// An export file as it is now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordsFile {
    pub sha256: String,
    pub rows: u64,
}

/// The user's record in the accounting database: its associations on any cluster
/// (`account on cluster`, `account/partition on cluster`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct UserRecord {
    pub associations: Vec<String>,
}

/// sacct's selection of the scope over all time, on this cluster, requeued runs included. The
/// window ends a day ahead: sacct leaves out a job that started in the very second its window
/// ends (`--endtime=now` missed a job started in the second of the export).
fn sacct_selection(cluster: &ClusterName, scope: &JobScope, accounts: &[SlurmAccount]) -> Vec<String> {
    let mut args = vec![
        "--allusers".to_string(),
        "--duplicates".into(),
        // All time, but not 1970-01-01: that is time 0, which sacct takes for "not given" and
        // replaces with today's midnight (after midnight an export would leave out every
        // earlier job; Slurm 22.05 here selected 32 of an account's 234 jobs).
        "--starttime=1970-01-02".into(),
        "--endtime=now+1days".into(),
        format!("--clusters={cluster}"),
    ];
    match scope {
        JobScope::User(u) | JobScope::UserIn(u, _) => args.push(format!("--user={u}")),
        JobScope::Account(_) => {}
    }
    if !accounts.is_empty() {
        let list: Vec<&str> = accounts.iter().map(SlurmAccount::as_str).collect();
        args.push(format!("--accounts={}", list.join(",")));
    }
    args
}

/// The export: a header line, then one `|`-separated row per job and step.
pub fn export(cluster: &ClusterName, scope: &JobScope, accounts: &[SlurmAccount], path: &HostPath) -> Command {
    Command::new("sh")
        .args(["-c", EXPORT_SCRIPT, "sh", path.as_str(), "sacct", "--parsable2"])
        .arg(format!("--format={SACCT_FIELDS}"))
        .args(sacct_selection(cluster, scope, accounts))
}

/// The same selection, one line per record, to count.
pub fn count(cluster: &ClusterName, scope: &JobScope, accounts: &[SlurmAccount]) -> Command {
    Command::new("sacct")
        .args(["--parsable2", "--noheader", "--format=JobIDRaw"])
        .args(sacct_selection(cluster, scope, accounts))
}

pub fn sha256sum(path: &HostPath) -> Command {
    Command::new("sha256sum").args(["--", path.as_str()])
}

pub fn line_count(path: &HostPath) -> Command {
    Command::new("wc").args(["-l", "--", path.as_str()])
}

/// The user and their associations on every cluster of the database.
pub fn show_user_record(user: &Username) -> Command {
    Command::new("sacctmgr")
        .args(["-n", "-P", "show", "user", "where"])
        .arg(format!("name={user}"))
        .args(["withassoc", "format=user,cluster,account,partition"])
}

/// `sha256sum`'s answer: the digest (64 lowercase hex digits) before the name.
pub fn parse_sha256(cmd: &str, out: &str) -> Result<String, SlurmError> {
    let first = out.split_whitespace().next().unwrap_or_default();
    let digest = first.trim_start_matches('\\');
    if digest.len() == 64 && digest.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()) {
        Ok(digest.to_string())
    } else {
        Err(SlurmError::Parse {
            cmd: cmd.into(),
            line: out.trim().chars().take(120).collect(),
            why: "not a sha256".into(),
        })
    }
}

/// `wc -l`'s answer as data rows: the lines less the header line.
pub fn parse_rows(cmd: &str, out: &str) -> Result<u64, SlurmError> {
    let first = out.split_whitespace().next().unwrap_or_default();
    let lines: u64 = first.parse().map_err(|_| SlurmError::Parse {
        cmd: cmd.into(),
        line: out.trim().chars().take(120).collect(),
        why: "not a line count".into(),
    })?;
    Ok(lines.saturating_sub(1))
}

/// `show user … withassoc` rows of `user`: `None` when there are none (no user record).
pub fn parse_user_record(user: &Username, out: &str) -> Option<UserRecord> {
    let rows: Vec<Vec<&str>> =
        out.lines().map(|l| l.split('|').collect::<Vec<_>>()).filter(|r| r[0] == user.as_str()).collect();
    if rows.is_empty() {
        return None;
    }
    let associations = rows
        .iter()
        .filter(|r| r.get(2).is_some_and(|a| !a.is_empty()))
        .map(|r| match r.get(3).filter(|p| !p.is_empty()) {
            Some(p) => format!("{}/{p} on {}", r[2], r[1]),
            None => format!("{} on {}", r[2], r[1]),
        })
        .collect();
    Some(UserRecord { associations })
}

impl SlurmCli {
    pub(super) async fn write_export(&self, scope: &JobScope, path: &HostPath) -> Result<RecordsExport, SlurmError> {
        let accounts = self.accounts_of(scope).await?;
        self.recorded_in_slurmdbd(scope, &accounts).await?;
        let cmd = export(&self.cluster, scope, &accounts, path);
        let out = self.run(&cmd).await?;
        parse::read_ok(&cmd.to_string(), &out)?;
        let Some(f) = self.read_export(path).await? else {
            return Err(SlurmError::NotConverged {
                what: format!("exporting the accounting records of {scope}"),
                want: format!("the file {}", path.as_str()),
                got: "no file".into(),
            });
        };
        Ok(RecordsExport { path: path.as_str().to_string(), sha256: f.sha256, rows: f.rows })
    }

    /// A job that just ended reaches slurmdbd some seconds later: every job slurmctld still holds
    /// for the scope must be in slurmdbd before the export, or the archive would leave it out.
    async fn recorded_in_slurmdbd(&self, scope: &JobScope, accounts: &[SlurmAccount]) -> Result<(), SlurmError> {
        let cmd = super::command::squeue_ids(&Self::who(scope, accounts));
        let held = self.read(&cmd).await?;
        let held: BTreeSet<&str> = held.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
        if held.is_empty() {
            return Ok(());
        }
        let recorded = self.read(&count(&self.cluster, scope, accounts)).await?;
        let recorded: BTreeSet<&str> = recorded.lines().filter_map(|l| l.trim().split('.').next()).collect();
        let missing: Vec<&str> = held.difference(&recorded).copied().collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(SlurmError::NotConverged {
            what: format!("slurmdbd's records of {scope}"),
            want: "every job slurmctld still holds recorded in slurmdbd before the export".into(),
            got: format!("job(s) {} not yet in slurmdbd", missing.join(", ")),
        })
    }

    pub(super) async fn read_export(&self, path: &HostPath) -> Result<Option<RecordsFile>, SlurmError> {
        let cmd = sha256sum(path);
        let out = self.run(&cmd).await?;
        if !out.success() && out.stderr.contains("No such file") {
            return Ok(None);
        }
        let sha256 = parse_sha256(&cmd.to_string(), parse::read_ok(&cmd.to_string(), &out)?)?;
        let cmd = line_count(path);
        let rows = parse_rows(&cmd.to_string(), &self.read(&cmd).await?)?;
        Ok(Some(RecordsFile { sha256, rows }))
    }

    pub(super) async fn count_in(&self, scope: &JobScope) -> Result<u64, SlurmError> {
        let accounts = self.accounts_of(scope).await?;
        let out = self.read(&count(&self.cluster, scope, &accounts)).await?;
        Ok(out.lines().filter(|l| !l.trim().is_empty()).count() as u64)
    }

    pub(super) async fn read_user_record(&self, user: &Username) -> Result<Option<UserRecord>, SlurmError> {
        Ok(parse_user_record(user, &self.read(&show_user_record(user)).await?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster() -> ClusterName {
        ClusterName::parse("production").unwrap()
    }

    #[test]
    fn the_export_is_a_constant_script_with_its_inputs_as_arguments() {
        let alice = Username::parse("alice").unwrap();
        let accounts = [SlurmAccount::parse("ml-team-foo").unwrap()];
        let path = HostPath::parse("/var/spool/slurm/archive/offboard-foo-ml-team-foo-alice-20261201.sacct").unwrap();
        let scope = JobScope::UserIn(alice.clone(), accounts.to_vec());
        let cmd = export(&cluster(), &scope, &accounts, &path);
        let argv = cmd.argv();
        assert_eq!(argv[..5], ["sh", "-c", EXPORT_SCRIPT, "sh", path.as_str()]);
        assert_eq!(
            argv[5..],
            [
                "sacct",
                "--parsable2",
                &format!("--format={SACCT_FIELDS}"),
                "--allusers",
                "--duplicates",
                "--starttime=1970-01-02",
                "--endtime=now+1days",
                "--clusters=production",
                "--user=alice",
                "--accounts=ml-team-foo"
            ]
        );
        // the count selects the same records
        let c = count(&cluster(), &scope, &accounts);
        assert_eq!(c.argv()[4..], argv[8..]);
        // a tenant: its accounts, every user
        let tree = [SlurmAccount::parse("tenant-foo").unwrap(), SlurmAccount::parse("ml-team-foo").unwrap()];
        let t = export(&cluster(), &JobScope::Account(tree[0].clone()), &tree, &path);
        assert_eq!(t.argv().last().unwrap(), "--accounts=tenant-foo,ml-team-foo");
        assert!(!t.argv().iter().any(|a| a.starts_with("--user")));
    }

    #[tokio::test]
    async fn the_script_writes_the_file_only_when_the_command_succeeds() {
        use crate::backends::exec::{Local, Transport};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.sacct");
        let p = path.to_str().unwrap();
        let run = |tail: &[&str]| {
            Command::new("sh").args(["-c", EXPORT_SCRIPT, "sh", p]).args(tail.iter().map(|s| s.to_string()))
        };
        let t = std::time::Duration::from_secs(5);
        let o = Local.run(&run(&["printf", "%s\\n", "h", "$(id)", "a b"]), t).await.unwrap();
        assert!(o.success(), "{o:?}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "h\n$(id)\na b\n");
        // a failing command leaves the earlier file, and no temporary one
        let o = Local.run(&run(&["sh", "-c", "echo partial; exit 3"]), t).await.unwrap();
        assert_eq!(o.code, 3);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "h\n$(id)\na b\n");
        assert!(!dir.path().join("x.sacct.tmp").exists());
    }

    #[test]
    fn read_backs_parse() {
        let sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        assert_eq!(parse_sha256("c", &format!("{sha}  /a/x.sacct\n")).unwrap(), sha);
        assert!(parse_sha256("c", "sha256sum: /a/x: Is a directory\n").is_err());
        assert!(parse_sha256("c", &sha.to_uppercase()).is_err());
        assert_eq!(parse_rows("c", "3 /a/x.sacct\n").unwrap(), 2);
        assert_eq!(parse_rows("c", "0 /a/x.sacct\n").unwrap(), 0);
        assert!(parse_rows("c", "wc: x\n").is_err());
    }

    #[test]
    fn a_user_record_lists_associations_on_every_cluster() {
        let bob = Username::parse("bob").unwrap();
        assert_eq!(parse_user_record(&bob, ""), None);
        assert_eq!(parse_user_record(&bob, "bobby|production|a|\n"), None);
        let r = parse_user_record(&bob, "bob|production|a|\nbob|other|b|gpu\n").unwrap();
        assert_eq!(r.associations, ["a on production", "b/gpu on other"]);
        assert_eq!(parse_user_record(&bob, "bob|||\n").unwrap().associations, Vec::<String>::new());
    }
}

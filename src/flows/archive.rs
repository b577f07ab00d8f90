//! The `archive` step of both offboardings and the guard of their delete steps.
//!
//! The step exports the scope's accounting records (a user's in one account, a tenant's in all
//! its accounts) with `sacct` over all time to `<archive dir>/<name>.sacct` on the Slurm host and
//! records the file's sha256 and row count, then runs `sacctmgr archive dump` (which writes, and
//! purges, only where slurmdbd's Purge*After settings say so: after the export, so the export
//! misses nothing). Before anything is deleted, [`require_archive_intact`] re-reads the file and
//! refuses when it is missing, differs from what the step recorded, or holds no records while
//! sacct shows some for the scope.

use serde::{Deserialize, Serialize};
use time::{Date, OffsetDateTime};

use super::StepResult;
use super::backends::{Backends, StepError};
use crate::backends::slurm::{HostPath, JobScope, RecordsFile};
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::engine::{StepCtx, Transition};

/// The `archive` step's output (of both offboardings).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Archived {
    /// What `sacctmgr archive dump` wrote (often nothing: see the module's note).
    pub directory: String,
    #[serde(default)]
    pub written: Vec<String>,
    #[serde(default)]
    pub message: String,
    /// The export of the accounting records; `None` in jobs archived before onramp exported them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<Export>,
}

/// One export as the archive step wrote and read it back.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct Export {
    pub path: String,
    pub sha256: String,
    /// Data rows in the file (a job or a step each).
    pub rows: u64,
    /// How many records sacct showed for the scope just before the export.
    pub records_at_export: u64,
}

/// What the delete step found when it re-read the export (part of its output).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Intact {
    pub path: String,
    pub sha256: String,
    pub rows: u64,
}

fn yyyymmdd(d: Date) -> String {
    format!("{:04}{:02}{:02}", d.year(), u8::from(d.month()), d.day())
}

/// A user's export: `offboard-<tenant>-<account>-<user>-<date>` (one per association and day).
pub fn user_export_name(tenant: &TenantName, account: &SlurmAccount, user: &Username, day: Date) -> String {
    format!("offboard-{tenant}-{account}-{user}-{}", yyyymmdd(day))
}

/// A tenant's export: `offboard-final-<tenant>-<date>`, as its scratch snapshot is named.
pub fn tenant_export_name(tenant: &TenantName, day: Date) -> String {
    format!("offboard-final-{tenant}-{}", yyyymmdd(day))
}

/// Exports the scope's records to `<archive dir>/<name>.sacct`, then runs the archive dump.
pub async fn archive(b: &Backends, scope: &JobScope, name: &str) -> StepResult {
    let dir = b.archive_dir.as_str().trim_end_matches('/');
    let path = HostPath::parse(&format!("{dir}/{name}.sacct")).map_err(|e| Transition::Fail(e.to_string()))?;
    let before = b.slurm.count_records(scope).await.step("count the accounting records (sacct)")?;
    let e = b.slurm.export_records(scope, &path).await.step("export the accounting records (sacct)")?;
    if e.rows < before {
        return Ok(Transition::Retry(format!(
            "the export {} holds {} rows, but sacct showed {before} records of {scope}",
            e.path, e.rows
        )));
    }
    let r = b.slurm.archive_dump(&b.archive_dir).await.step("sacctmgr archive dump")?;
    let export = Export { path: e.path, sha256: e.sha256, rows: e.rows, records_at_export: before };
    Ok(Transition::done(&Archived {
        directory: r.directory,
        written: r.written,
        message: r.message,
        export: Some(export),
    }))
}

/// Today's date (UTC), for export names.
pub fn today() -> Date {
    OffsetDateTime::now_utc().date()
}

/// Refuses (a `Fail` saying what differs) unless the export this job's `step` recorded is still
/// on the Slurm host as written, and holds records when sacct shows some for the scope.
pub async fn require_archive_intact(
    b: &Backends,
    ctx: &StepCtx,
    step: &str,
    scope: &JobScope,
) -> Result<Intact, Transition> {
    let recorded = ctx.output_of::<Archived>(step).and_then(|a| a.export).ok_or_else(|| {
        Transition::Fail(
            "refused: this job's archive step recorded no export of the accounting records; nothing was deleted. \
             Start a new offboarding: its archive step exports them"
                .into(),
        )
    })?;
    let path = HostPath::parse(&recorded.path).map_err(|e| Transition::Fail(format!("refused: {e}")))?;
    let now = b.slurm.records_file(&path).await.step("re-read the archive")?;
    let records_now = match &now {
        Some(f) if f.sha256 == recorded.sha256 && f.rows == 0 => {
            Some(b.slurm.count_records(scope).await.step("count the accounting records (sacct)")?)
        }
        _ => None,
    };
    verdict(&recorded, now.as_ref(), records_now, scope).map_err(Transition::Fail)?;
    Ok(Intact { path: recorded.path, sha256: recorded.sha256, rows: recorded.rows })
}

/// The guard's decision on what it read: the file now, and (when the file holds no rows) how many
/// records sacct shows now.
pub fn verdict(
    recorded: &Export,
    now: Option<&RecordsFile>,
    records_now: Option<u64>,
    scope: &JobScope,
) -> Result<(), String> {
    let (path, sha, rows) = (&recorded.path, &recorded.sha256, recorded.rows);
    let Some(f) = now else {
        return Err(format!(
            "refused: the archive {path} is missing (the archive step wrote {rows} rows, sha256 {sha}); nothing \
             was deleted. Restore the file, or start a new offboarding to export again"
        ));
    };
    if f.sha256 != *sha {
        return Err(format!(
            "refused: the archive {path} changed after the archive step: sha256 {} and {} rows now, {sha} and \
             {rows} rows when written; nothing was deleted",
            f.sha256, f.rows
        ));
    }
    match records_now {
        Some(n) if f.rows == 0 && n > 0 => Err(format!(
            "refused: the archive {path} holds no records while sacct shows {n} of {scope}; nothing was deleted. \
             Start a new offboarding to export them"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export(rows: u64) -> Export {
        Export { path: "/a/x.sacct".into(), sha256: "ab".repeat(32), rows, records_at_export: rows }
    }

    fn file(sha: &str, rows: u64) -> RecordsFile {
        RecordsFile { sha256: sha.into(), rows }
    }

    #[test]
    fn the_guard_refuses_a_missing_changed_or_empty_archive() {
        let scope = JobScope::User(Username::parse("alice").unwrap());
        let e = export(2);
        assert_eq!(verdict(&e, Some(&file(&e.sha256, 2)), None, &scope), Ok(()));
        let missing = verdict(&e, None, None, &scope).unwrap_err();
        assert!(missing.starts_with("refused: the archive /a/x.sacct is missing"), "{missing}");
        let changed = verdict(&e, Some(&file(&"cd".repeat(32), 2)), None, &scope).unwrap_err();
        assert!(changed.contains("changed after the archive step") && changed.contains(&"cd".repeat(32)), "{changed}");
        // truncated: the checksum differs, and the message says how many rows are left
        let truncated = verdict(&e, Some(&file(&"00".repeat(32), 0)), None, &scope).unwrap_err();
        assert!(truncated.contains("and 0 rows now"), "{truncated}");
        // an export that came out empty: refused only while sacct shows records
        let empty = export(0);
        let refused = verdict(&empty, Some(&file(&empty.sha256, 0)), Some(3), &scope).unwrap_err();
        assert!(refused.contains("holds no records while sacct shows 3 of user alice"), "{refused}");
        assert_eq!(verdict(&empty, Some(&file(&empty.sha256, 0)), Some(0), &scope), Ok(()));
    }

    #[test]
    fn export_names_say_whose_records_and_when() {
        let d = Date::from_calendar_date(2026, time::Month::December, 1).unwrap();
        let (t, a, u) = (
            TenantName::parse("foo").unwrap(),
            SlurmAccount::parse("ml-team-foo").unwrap(),
            Username::parse("alice").unwrap(),
        );
        assert_eq!(user_export_name(&t, &a, &u, d), "offboard-foo-ml-team-foo-alice-20261201");
        assert_eq!(tenant_export_name(&t, d), "offboard-final-foo-20261201");
    }

    #[test]
    fn archive_outputs_of_older_jobs_still_read() {
        let old: Archived = serde_json::from_value(serde_json::json!({ "directory": "/a" })).unwrap();
        assert!(old.export.is_none());
    }
}

//! The tenant offboarding's snapshots: taken before anything is deleted, and checked again at the
//! delete step (see [`super::tenant`]).

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::backends::{Backends, StepError};
use super::tenant::OffboardStep;
use super::user_offboard::Archived;
use super::{StepResult, verify};
use crate::backends::storage::{Snapshot, SnapshotName};
use crate::domain::names::{TenantName, Username};
use crate::domain::tenants::Tenant;
use crate::engine::{StepCtx, Transition};

/// The `snapshot` step's output: the tenant's scratch, then each user's `$HOME`.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Snapshots {
    pub snapshots: Vec<Taken>,
}

/// One snapshot the `snapshot` step took (or found taken).
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct Taken {
    pub snapshot: String,
    pub existed: bool,
    /// Whose `$HOME` it is of; absent for the tenant's scratch (always the first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
}

/// The tenant's scratch and its users' homes, before anything is deleted.
pub(super) async fn snapshot(b: &Backends, t: &Tenant, name: &TenantName) -> StepResult {
    let d = OffsetDateTime::now_utc().date();
    let date = format!("{:04}{:02}{:02}", d.year(), u8::from(d.month()), d.day());
    let mut taken = vec![];
    let scratch =
        SnapshotName::parse(&format!("offboard-final-{name}-{date}")).map_err(|e| Transition::Fail(e.to_string()))?;
    let s = b.storage.snapshot(&verify::scratch_place(t), &scratch).await.step("snapshot scratch")?;
    taken.push(Taken { snapshot: scratch.as_str().to_string(), existed: s == Snapshot::Exists, user: None });
    let assocs = b.slurm.associations(&t.accounts()).await.step("list the tenant's users")?;
    let mut users: Vec<&str> = assocs.iter().filter(|a| !a.user.is_empty()).map(|a| a.user.as_str()).collect();
    users.sort_unstable();
    users.dedup();
    for u in users {
        let Ok(user) = Username::parse(u) else { continue };
        let n = SnapshotName::offboard(&user, d);
        let s = b.storage.snapshot(&verify::home_place(t, &user), &n).await.step("snapshot a user's $HOME")?;
        let user = Some(user.to_string());
        taken.push(Taken { snapshot: n.as_str().to_string(), existed: s == Snapshot::Exists, user });
    }
    Ok(Transition::done(&Snapshots { snapshots: taken }))
}

/// Every snapshot this job took is still there at the delete step. The filesystem CLIs have no
/// common read-only check, so each is taken again under its name: "already exists" lets the delete
/// go on; one that was gone (deleted by hand) has just been taken again from the data as it is,
/// and the delete is refused until a person looks and retries.
pub(super) async fn require_snapshots(b: &Backends, t: &Tenant, ctx: &StepCtx) -> Result<(), Transition> {
    let snaps = ctx.output_of::<Snapshots>(OffboardStep::Snapshot.name()).map(|s| s.snapshots).unwrap_or_default();
    let mut gone = vec![];
    for (i, s) in snaps.iter().enumerate() {
        let name = SnapshotName::parse(&s.snapshot).map_err(|e| Transition::Fail(e.to_string()))?;
        // outputs written before `user` was recorded: a user's is named offboard-<user>-<yyyymmdd>
        let user = s.user.clone().or_else(|| {
            let rest = s.snapshot.strip_prefix("offboard-")?;
            (i > 0).then(|| rest.rsplit_once('-').map(|(u, _)| u.to_string())).flatten()
        });
        let place = match user {
            None => verify::scratch_place(t),
            Some(u) => verify::home_place(t, &Username::parse(&u).map_err(|e| Transition::Fail(e.to_string()))?),
        };
        if b.storage.snapshot(&place, &name).await.step("check a snapshot")? == Snapshot::Created {
            gone.push(name.as_str().to_string());
        }
    }
    if gone.is_empty() {
        return Ok(());
    }
    Err(Transition::Fail(format!(
        "refused: the snapshot(s) {} of tenant {} were gone at the delete step (deleted by hand?); nothing was \
         deleted. They were taken again now from the data as it is; check them, then retry the job to delete",
        gone.join(", "),
        t.name
    )))
}

/// Deletion only after this job's snapshot and archive steps succeeded.
pub fn require_snapshot_and_archive(ctx: &StepCtx) -> Result<(), String> {
    let snap = ctx.output_of::<Snapshots>(OffboardStep::Snapshot.name()).is_some_and(|s| !s.snapshots.is_empty());
    let archive = ctx.output_of::<Archived>(OffboardStep::Archive.name()).is_some();
    if snap && archive {
        Ok(())
    } else {
        Err(format!(
            "refused: the tenant's accounts are deleted only after this job's snapshot and archive succeeded \
             (snapshot: {}, archive: {})",
            if snap { "done" } else { "missing" },
            if archive { "done" } else { "missing" }
        ))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::flows::tenant::TENANT_OFFBOARD;

    fn ctx(outputs: Value) -> StepCtx {
        let outputs = outputs.as_object().cloned().unwrap_or_default();
        StepCtx::detached(
            TENANT_OFFBOARD,
            "foo/tenant",
            json!({ "tenant": "foo" }),
            outputs,
            OffboardStep::DeleteAccounts.name(),
            9,
        )
    }

    #[test]
    fn accounts_are_deleted_only_after_this_jobs_snapshot_and_archive() {
        let one = json!([{ "snapshot": "offboard-final-foo-20261130", "existed": false }]);
        assert!(require_snapshot_and_archive(&ctx(json!({}))).unwrap_err().starts_with("refused"));
        let snap_only = json!({ "snapshot": { "snapshots": one } });
        assert!(require_snapshot_and_archive(&ctx(snap_only)).unwrap_err().contains("archive: missing"));
        let archive_only = json!({ "archive": { "directory": "/a" }, "snapshot": { "snapshots": [] } });
        assert!(require_snapshot_and_archive(&ctx(archive_only)).unwrap_err().contains("snapshot: missing"));
        let both = json!({ "snapshot": { "snapshots": one }, "archive": { "directory": "/a" } });
        assert!(require_snapshot_and_archive(&ctx(both)).is_ok());
    }
}

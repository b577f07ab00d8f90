//! The Slurm backend: one trait, [`Slurm`], and its one real implementation, [`SlurmCli`], which
//! runs Slurm's command-line tools through a [`crate::backends::exec::Transport`] (here, or in the
//! slurmctld pod). Commands (argv, `command`) are apart from reading their answers (`parse`) and
//! from where they run (the transport).
//!
//! Every operation is idempotent and verifies its effect by reading Slurm's state back: running
//! it twice changes nothing the second time, and a spec that differs from what Slurm holds is
//! converged. "Already exists", "nothing modified" and "nothing deleted" are outcomes, not errors.
//! Errors say whether trying again may help ([`SlurmError::is_retryable`]).

mod accounts;
mod batch;
mod client;
mod coalesce;
pub mod command;
mod error;
pub mod export;
mod gate;
pub mod parse;
pub mod qos;
mod types;
mod users;
mod values;

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

pub use batch::Batching;
pub use client::{GateGuard, SlurmCli, WriteGate};
pub use error::{Shared, SlurmError};
pub use export::{RecordsExport, RecordsFile, UserRecord};
pub use gate::PgWriteGate;
pub use qos::{QosSpec, QosState};
pub use types::*;
pub use users::limits_differ;
pub use values::*;

use crate::domain::names::{QosName, SlurmAccount, Username};

pub type SlurmFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, SlurmError>> + Send + 'a>>;

/// What onramp does to Slurm. Flows hold an `Arc<dyn Slurm>`.
pub trait Slurm: Send + Sync {
    /// The tenant account (under root unless its spec names a parent) and its team
    /// sub-accounts, with their limits converged.
    fn ensure_tenant<'a>(&'a self, spec: &'a TenantSpec) -> SlurmFuture<'a, Ensured>;
    /// One account (its parent must exist), with its limits converged.
    fn ensure_account<'a>(&'a self, spec: &'a AccountSpec) -> SlurmFuture<'a, Ensured>;
    /// The user's association with the account, its limits and (if asked) the DefaultAccount.
    /// Converging limits that include `max_jobs`/`grp_jobs` lifts a block.
    fn ensure_user<'a>(&'a self, spec: &'a UserSpec) -> SlurmFuture<'a, Ensured>;
    /// Many users' associations with one account: one `add user a,b,c` for the missing ones,
    /// one `modify` for those whose limits differ, one read before and one after. `created` and
    /// `changed` list user names; `users` holds each user's record as the read after found it
    /// (the read before, when nothing changed).
    fn add_users<'a>(
        &'a self,
        account: &'a SlurmAccount,
        users: &'a [Username],
        default_account: bool,
        limits: &'a UserLimits,
    ) -> SlurmFuture<'a, Ensured>;
    /// The QOS, created or converged (cluster-wide), before any association names them.
    fn ensure_qos<'a>(&'a self, specs: &'a [QosSpec]) -> SlurmFuture<'a, Ensured>;
    /// Those of the QOS named that Slurm has.
    fn qos<'a>(&'a self, names: &'a [QosName]) -> SlurmFuture<'a, Vec<QosState>>;
    /// The user's default account and associations on the cluster; `None` if Slurm has no such user.
    fn user<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Option<UserState>>;
    /// Those of `users` Slurm has, by name, in one read.
    fn users<'a>(&'a self, users: &'a [Username]) -> SlurmFuture<'a, BTreeMap<String, UserState>>;
    /// Every association (accounts' and users') whose account is one of `accounts`, in one read.
    fn associations<'a>(&'a self, accounts: &'a [SlurmAccount]) -> SlurmFuture<'a, Vec<Association>>;

    /// `MaxJobs=0 GrpJobs=0 MaxSubmitJobs=0` on each of the user's associations with `accounts`
    /// (one tenant's): running jobs go on, nothing new starts, and sbatch refuses new jobs there.
    /// Associations with other accounts (another tenant's) are left alone.
    fn block_user<'a>(&'a self, user: &'a Username, accounts: &'a [SlurmAccount]) -> SlurmFuture<'a, Ensured>;
    /// Lifts the block on the associations with `accounts`: MaxJobs and GrpJobs from `limits`
    /// (unlimited when unset), MaxSubmitJobs cleared.
    fn unblock_user<'a>(
        &'a self,
        user: &'a Username,
        accounts: &'a [SlurmAccount],
        limits: &'a UserLimits,
    ) -> SlurmFuture<'a, Ensured>;
    /// `GrpJobs=0 GrpSubmitJobs=0` on the account: caps its whole subtree.
    fn block_account<'a>(&'a self, account: &'a SlurmAccount) -> SlurmFuture<'a, Ensured>;
    /// Lifts the block: GrpJobs to `grp_jobs`, GrpSubmitJobs cleared.
    fn unblock_account<'a>(&'a self, account: &'a SlurmAccount, grp_jobs: Limit) -> SlurmFuture<'a, Ensured>;

    /// Jobs slurmctld still knows (pending, running, completing…). An account's scope includes
    /// every account below it (a tenant's jobs are charged to its teams).
    fn jobs<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Vec<SlurmJob>>;
    /// `scancel --state=PENDING`; running jobs are left alone.
    fn cancel_pending<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Cancelled>;
    /// `scancel` of every job in the scope (the hard cutoff). Running jobs take a moment to end:
    /// `remaining` lists what was still there right after.
    fn cancel_all<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Cancelled>;

    /// `sacctmgr archive dump Directory=…`, reporting the files that really appeared.
    fn archive_dump<'a>(&'a self, dir: &'a HostPath) -> SlurmFuture<'a, ArchiveReport>;
    /// The scope's accounting records over all time (sacct, `|`-separated, a header line then a
    /// row per job and step) written to `path` on the Slurm host, then read back there.
    fn export_records<'a>(&'a self, scope: &'a JobScope, path: &'a HostPath) -> SlurmFuture<'a, RecordsExport>;
    /// An export's sha256 and data rows as the Slurm host reads them now; `None`: no such file.
    fn records_file<'a>(&'a self, path: &'a HostPath) -> SlurmFuture<'a, Option<RecordsFile>>;
    /// How many accounting records (jobs and steps) sacct shows for the scope now.
    fn count_records<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, u64>;
    /// The user's record in the accounting database with its associations on any cluster;
    /// `None` when there is no such user (Slurm 22.05 removes the record with its last association).
    fn user_record<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Option<UserRecord>>;

    /// Removes the user's association with the account, refusing while the user has jobs there;
    /// switches the DefaultAccount to another association first when needed.
    fn delete_user_association<'a>(&'a self, user: &'a Username, account: &'a SlurmAccount)
    -> SlurmFuture<'a, Deleted>;
    /// Removes the user's associations on the cluster and the user record; refuses while the
    /// user has jobs.
    fn delete_user<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Deleted>;
    /// Removes the account and every account below it (explicitly: deleting a parent leaves
    /// the child account rows behind); refuses while any of them has jobs.
    fn delete_account<'a>(&'a self, account: &'a SlurmAccount) -> SlurmFuture<'a, Deleted>;

    /// `scontrol show config` as key/value pairs.
    fn config(&self) -> SlurmFuture<'_, BTreeMap<String, String>>;
    /// A file on the Slurm host (e.g. cgroup.conf); `None` when it cannot be read.
    fn read_file<'a>(&'a self, path: &'a HostPath) -> SlurmFuture<'a, Option<String>>;
}

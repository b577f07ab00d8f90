//! [`SlurmCli`]: the [`Slurm`] trait over Slurm's command-line tools and a transport. Jobs,
//! archive and configuration live here; accounts and users in their own files.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use super::parse::{self, Outcome};
use super::{command, *};
use crate::backends::exec::{Command, Output, Transport};
use crate::domain::names::ClusterName;

/// Concurrent sacctmgr writes lose data on Slurm 22.05: eight parallel `add account` all
/// answered rc 0 and "Adding Account(s)", and two of the accounts existed afterwards (slurmdbd
/// logs MySQL deadlocks and restarts the statement, not the transaction). So this process sends
/// one write at a time, whatever the `SlurmCli` instance; reads run in parallel. Other processes
/// writing to the same slurmdbd need their own exclusion; the read-back after every write turns
/// a lost write into a retryable [`SlurmError::NotConverged`].
static WRITES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What one `enter` holds; dropping it lets the next writer in.
pub type GateGuard = Box<dyn Send + Sync>;

/// Exclusion of Slurm writes across processes (several onramp replicas writing to one slurmdbd).
/// Entered after this process's own lock; the guard must release on drop, so a step stopped in
/// the middle of a write never leaves the gate closed.
pub trait WriteGate: Send + Sync {
    fn enter(&self) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<GateGuard, String>> + Send + '_>>;
}

/// Slurm through its command-line tools. Everything is scoped to one cluster.
#[derive(Clone)]
pub struct SlurmCli {
    transport: Arc<dyn Transport>,
    pub(super) cluster: ClusterName,
    timeout: Duration,
    gate: Option<Arc<dyn WriteGate>>,
}

impl SlurmCli {
    pub fn new(transport: Arc<dyn Transport>, cluster: ClusterName) -> Self {
        Self { transport, cluster, timeout: Duration::from_secs(60), gate: None }
    }

    /// Writes also pass `gate`, shared with the other processes that write to this cluster.
    pub fn with_write_gate(mut self, gate: Arc<dyn WriteGate>) -> Self {
        self.gate = Some(gate);
        self
    }

    /// How long one command may take (default 60 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    pub(super) async fn run(&self, cmd: &Command) -> Result<Output, SlurmError> {
        tracing::debug!(%cmd, "slurm");
        self.transport
            .run(cmd, self.timeout)
            .await
            .map_err(|source| SlurmError::Transport { cmd: cmd.to_string(), source })
    }

    /// A read: the rows on stdout.
    pub(super) async fn read(&self, cmd: &Command) -> Result<String, SlurmError> {
        let out = self.run(cmd).await?;
        parse::read_ok(&cmd.to_string(), &out).map(str::to_string)
    }

    /// Runs a command that changes Slurm, one at a time (see [`WRITES`]).
    async fn run_write(&self, cmd: &Command) -> Result<Output, SlurmError> {
        let _one_at_a_time = WRITES.lock().await;
        let _across_processes = match &self.gate {
            Some(g) => Some(g.enter().await.map_err(|e| SlurmError::Transport {
                cmd: cmd.to_string(),
                source: crate::backends::exec::TransportError::Transient(format!("the Slurm write gate: {e}")),
            })?),
            None => None,
        };
        self.run(cmd).await
    }

    /// A write: what happened, or the error.
    pub(super) async fn write(&self, cmd: &Command) -> Result<Outcome, SlurmError> {
        let out = self.run_write(cmd).await?;
        let o = parse::outcome(&cmd.to_string(), &out);
        tracing::info!(%cmd, outcome = ?o.as_ref().map_err(|e| e.kind()), "slurm write");
        o
    }

    /// A write whose effect the caller reads back. An exit that says it failed for a reason
    /// sacctmgr does not name ([`SlurmError::Failed`]) is not final: the change may have been
    /// committed with the reply lost on its way back (sacctmgr then exits 1 after slurmdbd
    /// applied it). Such a failure goes to `unsure` and the answer is `None`; the caller's
    /// read-back decides, and returns that error only if the state did not converge. Trusting the
    /// exit code would fail a job whose change holds, or make a retry that doubles it.
    pub(super) async fn write_read_back(
        &self,
        cmd: &Command,
        unsure: &mut Option<SlurmError>,
    ) -> Result<Option<Outcome>, SlurmError> {
        match self.write(cmd).await {
            Err(e @ SlurmError::Failed { .. }) => {
                tracing::warn!(%cmd, error = %e, "slurm write exited with an error; reading back whether it took effect");
                unsure.get_or_insert(e);
                Ok(None)
            }
            other => other.map(Some),
        }
    }

    /// An account scope is the account and every account below it: jobs are charged to the
    /// team accounts, and squeue/scancel `--account=tenant` would not see them.
    pub(super) async fn accounts_of(&self, scope: &JobScope) -> Result<Vec<SlurmAccount>, SlurmError> {
        let a = match scope {
            JobScope::Account(a) => a,
            JobScope::UserIn(_, accounts) => return Ok(accounts.clone()),
            JobScope::User(_) => return Ok(vec![]),
        };
        let (tree, _) = self.subtree(a).await?;
        let mut accounts: Vec<SlurmAccount> = tree.iter().filter_map(|n| SlurmAccount::parse(n).ok()).collect();
        if accounts.is_empty() {
            accounts.push(a.clone());
        }
        Ok(accounts)
    }

    pub(super) fn who<'a>(scope: &'a JobScope, accounts: &'a [SlurmAccount]) -> command::Who<'a> {
        match scope {
            JobScope::User(u) => command::Who::User(u),
            JobScope::UserIn(u, _) => command::Who::UserIn(u, accounts),
            JobScope::Account(_) => command::Who::Accounts(accounts),
        }
    }

    async fn squeue(&self, who: &command::Who<'_>) -> Result<Vec<SlurmJob>, SlurmError> {
        let cmd = command::squeue(who);
        parse::jobs(&cmd.to_string(), &self.read(&cmd).await?)
    }

    pub(super) async fn jobs_of(&self, scope: &JobScope) -> Result<Vec<SlurmJob>, SlurmError> {
        let accounts = self.accounts_of(scope).await?;
        self.squeue(&Self::who(scope, &accounts)).await
    }

    /// Jobs in any of the accounts, optionally of one user only (by name, as squeue shows it).
    /// Asking by account works for users the host cannot resolve.
    pub(super) async fn jobs_in(
        &self,
        accounts: &[SlurmAccount],
        user: Option<&Username>,
    ) -> Result<Vec<SlurmJob>, SlurmError> {
        if accounts.is_empty() {
            return Ok(vec![]);
        }
        let jobs = self.squeue(&command::Who::Accounts(accounts)).await?;
        Ok(jobs.into_iter().filter(|j| user.is_none_or(|u| j.user == u.as_str())).collect())
    }

    async fn cancel(&self, scope: &JobScope, pending_only: bool) -> Result<Cancelled, SlurmError> {
        let targeted = |j: &SlurmJob| !pending_only || j.state == SlurmJobState::Pending;
        let accounts = self.accounts_of(scope).await?;
        let who = Self::who(scope, &accounts);
        let before: Vec<SlurmJob> = self.squeue(&who).await?.into_iter().filter(targeted).collect();
        if before.is_empty() {
            return Ok(Cancelled::default());
        }
        let ids: Vec<&str> = before.iter().map(|j| j.id.as_str()).collect();
        if let Some(bad) = ids.iter().find(|i| !command::is_job_id(i)) {
            return Err(SlurmError::Parse { cmd: "squeue".into(), line: bad.to_string(), why: "not a job id".into() });
        }
        self.write(&command::scancel(&who, &ids, pending_only)).await?;
        let after = self.squeue(&who).await?;
        let still: BTreeSet<&str> = after.iter().filter(|j| targeted(j)).map(|j| j.id.as_str()).collect();
        // Gone from squeue: cancelled. (A pending job that started meanwhile is neither.)
        let known: BTreeSet<&str> = after.iter().map(|j| j.id.as_str()).collect();
        let cancelled = before.iter().filter(|j| !known.contains(j.id.as_str())).map(|j| j.id.clone()).collect();
        if pending_only {
            let left: Vec<&str> = before.iter().map(|j| j.id.as_str()).filter(|id| still.contains(id)).collect();
            if !left.is_empty() {
                return Err(SlurmError::NotConverged {
                    what: format!("cancelling pending jobs of {scope}"),
                    want: "none pending".into(),
                    got: left.join(","),
                });
            }
        }
        Ok(Cancelled { cancelled, remaining: after.into_iter().filter(targeted).collect() })
    }

    async fn list_dir(&self, dir: &HostPath) -> Result<BTreeSet<String>, SlurmError> {
        let listing = self.read(&command::list_dir(dir)).await?;
        Ok(listing.lines().filter(|l| !l.is_empty()).map(str::to_string).collect())
    }

    async fn archive(&self, dir: &HostPath) -> Result<ArchiveReport, SlurmError> {
        let before = self.list_dir(dir).await?;
        let cmd = command::archive_dump(dir);
        let out = self.run_write(&cmd).await?;
        parse::outcome(&cmd.to_string(), &out)?;
        let after = self.list_dir(dir).await?;
        let message = format!("{} {}", out.stdout.trim(), out.stderr.trim()).trim().to_string();
        Ok(ArchiveReport {
            directory: dir.as_str().to_string(),
            written: after.difference(&before).cloned().collect(),
            message,
        })
    }
}

impl Slurm for SlurmCli {
    fn ensure_tenant<'a>(&'a self, spec: &'a TenantSpec) -> SlurmFuture<'a, Ensured> {
        Box::pin(async move {
            if let Some(t) = spec.teams.iter().find(|t| t.parent.as_ref() != Some(&spec.account.name)) {
                return Err(SlurmError::Invalid(format!(
                    "team account {} must have parent {}",
                    t.name, spec.account.name
                )));
            }
            let all: Vec<&AccountSpec> = std::iter::once(&spec.account).chain(&spec.teams).collect();
            self.ensure_accounts(all).await
        })
    }
    fn ensure_account<'a>(&'a self, spec: &'a AccountSpec) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.ensure_accounts(vec![spec]))
    }
    fn ensure_user<'a>(&'a self, spec: &'a UserSpec) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.ensure_users(&spec.account, std::slice::from_ref(&spec.user), spec.default_account, &spec.limits))
    }
    fn add_users<'a>(
        &'a self,
        account: &'a SlurmAccount,
        users: &'a [Username],
        default_account: bool,
        limits: &'a UserLimits,
    ) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.ensure_users(account, users, default_account, limits))
    }
    fn ensure_qos<'a>(&'a self, specs: &'a [QosSpec]) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.ensure_qos_all(specs))
    }
    fn qos<'a>(&'a self, names: &'a [crate::domain::names::QosName]) -> SlurmFuture<'a, Vec<QosState>> {
        Box::pin(async move { Ok(self.read_qos(names).await?.into_values().collect()) })
    }
    fn user<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Option<UserState>> {
        Box::pin(async move { Ok(self.read_users(std::slice::from_ref(user)).await?.remove(user.as_str())) })
    }
    fn users<'a>(&'a self, users: &'a [Username]) -> SlurmFuture<'a, BTreeMap<String, UserState>> {
        Box::pin(self.read_users(users))
    }
    fn associations<'a>(&'a self, accounts: &'a [SlurmAccount]) -> SlurmFuture<'a, Vec<Association>> {
        Box::pin(async move {
            if accounts.is_empty() {
                return Ok(vec![]);
            }
            let cmd = command::show_assocs(&self.cluster, accounts);
            parse::assocs(&cmd.to_string(), &self.read(&cmd).await?)
        })
    }
    fn block_user<'a>(&'a self, user: &'a Username, accounts: &'a [SlurmAccount]) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.set_user_block(user, accounts, None))
    }
    fn unblock_user<'a>(
        &'a self,
        user: &'a Username,
        accounts: &'a [SlurmAccount],
        limits: &'a UserLimits,
    ) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.set_user_block(user, accounts, Some(limits)))
    }
    fn block_account<'a>(&'a self, account: &'a SlurmAccount) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.set_account_block(account, None))
    }
    fn unblock_account<'a>(&'a self, account: &'a SlurmAccount, grp_jobs: Limit) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.set_account_block(account, Some(grp_jobs)))
    }
    fn jobs<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Vec<SlurmJob>> {
        Box::pin(self.jobs_of(scope))
    }
    fn cancel_pending<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Cancelled> {
        Box::pin(self.cancel(scope, true))
    }
    fn cancel_all<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Cancelled> {
        Box::pin(self.cancel(scope, false))
    }
    fn archive_dump<'a>(&'a self, dir: &'a HostPath) -> SlurmFuture<'a, ArchiveReport> {
        Box::pin(self.archive(dir))
    }
    fn export_records<'a>(&'a self, scope: &'a JobScope, path: &'a HostPath) -> SlurmFuture<'a, RecordsExport> {
        Box::pin(self.write_export(scope, path))
    }
    fn records_file<'a>(&'a self, path: &'a HostPath) -> SlurmFuture<'a, Option<RecordsFile>> {
        Box::pin(self.read_export(path))
    }
    fn count_records<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, u64> {
        Box::pin(self.count_in(scope))
    }
    fn user_record<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Option<UserRecord>> {
        Box::pin(self.read_user_record(user))
    }
    fn delete_user_association<'a>(
        &'a self,
        user: &'a Username,
        account: &'a SlurmAccount,
    ) -> SlurmFuture<'a, Deleted> {
        Box::pin(self.remove_user(user, Some(account)))
    }
    fn delete_user<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Deleted> {
        Box::pin(self.remove_user(user, None))
    }
    fn delete_account<'a>(&'a self, account: &'a SlurmAccount) -> SlurmFuture<'a, Deleted> {
        Box::pin(self.remove_account(account))
    }
    fn config(&self) -> SlurmFuture<'_, BTreeMap<String, String>> {
        Box::pin(async move { Ok(parse::config(&self.read(&command::show_config()).await?)) })
    }
    fn read_file<'a>(&'a self, path: &'a HostPath) -> SlurmFuture<'a, Option<String>> {
        Box::pin(async move {
            let out = self.run(&command::read_file(path)).await?;
            Ok(out.success().then_some(out.stdout))
        })
    }
}

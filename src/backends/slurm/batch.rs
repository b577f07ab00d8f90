//! [`Batching`]: many concurrent `add_users` calls for one account become one `add user a,b,c`.
//! The first call for an (account, limits) waits a short window for others, then makes the one
//! call for all of them; each caller gets the outcome for its own users. Association reads of the
//! same accounts are shared, and single-user reads become one read of all the users asked for
//! meanwhile ([`Coalesced`]); everything else passes through. Onboarding jobs due at the same
//! moment run concurrently on a worker, so their associations are created together (the
//! runbook's batching; `sacctmgr` takes about as long for 100 users as for one).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;

use super::coalesce::Coalesced;
use super::*;

/// The batch's result, and the effects (commands) of the one call, which every member's attempt
/// records as its own.
type Outcome = Option<(Result<Ensured, Shared>, Vec<serde_json::Value>)>;

struct Batch {
    users: Vec<Username>,
    done: watch::Receiver<Outcome>,
}

pub struct Batching {
    inner: Arc<dyn Slurm>,
    window: Duration,
    open: Mutex<HashMap<String, Batch>>,
    /// Held by the batch being written: one at a time per process.
    turn: tokio::sync::Mutex<()>,
    /// Association reads, by the accounts read.
    reads: Coalesced<Vec<String>, Vec<SlurmAccount>, Vec<Association>>,
    /// Single-user reads: one read takes every user asked for meanwhile.
    user_reads: Coalesced<(), Vec<Username>, Arc<BTreeMap<String, UserState>>>,
}

/// Users named in one `sacctmgr show user` at most (its argv, or the exec request's URL, stays
/// short).
const USERS_PER_READ: usize = 200;

impl Batching {
    pub fn new(inner: Arc<dyn Slurm>, window: Duration) -> Self {
        Self {
            inner,
            window,
            open: Mutex::default(),
            turn: tokio::sync::Mutex::new(()),
            reads: Coalesced::new("shared association read"),
            user_reads: Coalesced::new("shared user read"),
        }
    }

    async fn user_shared(&self, user: &Username) -> Result<Option<UserState>, SlurmError> {
        let inner = self.inner.clone();
        let ask = |asked: &mut Vec<Username>| {
            if !asked.contains(user) {
                asked.push(user.clone());
            }
        };
        let all = self
            .user_reads
            .read((), ask, move |users| async move {
                let mut all = BTreeMap::new();
                for chunk in users.chunks(USERS_PER_READ) {
                    all.extend(inner.users(chunk).await?);
                }
                Ok(Arc::new(all))
            })
            .await?;
        Ok(all.get(user.as_str()).cloned())
    }

    async fn associations_shared(&self, accounts: &[SlurmAccount]) -> Result<Vec<Association>, SlurmError> {
        let mut key: Vec<String> = accounts.iter().map(|a| a.to_string()).collect();
        key.sort_unstable();
        key.dedup();
        let inner = self.inner.clone();
        let ask = |asked: &mut Vec<SlurmAccount>| {
            if asked.is_empty() {
                asked.extend_from_slice(accounts);
            }
        };
        self.reads.read(key, ask, move |accounts| async move { inner.associations(&accounts).await }).await
    }

    async fn add(
        &self,
        account: &SlurmAccount,
        users: &[Username],
        default_account: bool,
        limits: &UserLimits,
    ) -> Result<Ensured, SlurmError> {
        let key = format!("{account}|{default_account}|{limits:?}");
        let (leader, mut rx) = {
            let mut open = self.open.lock().expect("batches");
            // a batch whose leader was dropped (cancelled) is replaced, never joined
            match open.get_mut(&key).filter(|b| b.done.has_changed().is_ok()) {
                Some(b) => {
                    b.users.extend(users.iter().cloned());
                    (None, b.done.clone())
                }
                None => {
                    let (tx, rx) = watch::channel(None);
                    open.insert(key.clone(), Batch { users: users.to_vec(), done: rx.clone() });
                    (Some(tx), rx)
                }
            }
        };
        if let Some(tx) = leader {
            return self.lead(key, tx, account, users, default_account, limits).await;
        }
        let outcome = rx.wait_for(Option::is_some).await.map(|o| o.clone()).ok().flatten();
        let result = outcome.map(|(r, effects)| {
            effects.into_iter().for_each(crate::effects::record);
            r
        });
        mine(result, users)
    }

    /// Waits the window and its turn, closes the batch and makes the one call. Slurm writes go one
    /// at a time anyway (the write gate), so a batch waiting for its turn behind another stays
    /// open: the calls that come meanwhile join it instead of queueing as batches of their own
    /// (which made 1,000 onboardings mostly one-user `add user`s).
    async fn lead(
        &self,
        key: String,
        tx: watch::Sender<Outcome>,
        account: &SlurmAccount,
        users: &[Username],
        default_account: bool,
        limits: &UserLimits,
    ) -> Result<Ensured, SlurmError> {
        tokio::time::sleep(self.window).await;
        let _turn = self.turn.lock().await;
        let all = self.open.lock().expect("batches").remove(&key).map(|b| b.users).unwrap_or_default();
        let (r, effects) = crate::effects::collect(self.inner.add_users(account, &all, default_account, limits)).await;
        effects.iter().cloned().for_each(crate::effects::record);
        let shared = match &r {
            Ok(e) => Ok(e.clone()),
            Err(e) => Err(e.shared()),
        };
        tx.send_replace(Some((shared, effects)));
        match r {
            Ok(e) => mine(Some(Ok(e)), users),
            Err(e) => Err(e),
        }
    }
}

/// The batch's outcome for `users` only.
fn mine(outcome: Option<Result<Ensured, Shared>>, users: &[Username]) -> Result<Ensured, SlurmError> {
    match outcome {
        Some(Ok(e)) => {
            let ours = |s: &String| users.iter().any(|u| s == u.as_str() || s.starts_with(&format!("{u}: ")));
            Ok(Ensured {
                created: e.created.into_iter().filter(|s| ours(s)).collect(),
                changed: e.changed.into_iter().filter(|s| ours(s)).collect(),
                users: Arc::new(
                    users.iter().filter_map(|u| Some((u.to_string(), e.users.get(u.as_str())?.clone()))).collect(),
                ),
            })
        }
        Some(Err(shared)) => Err(shared.into()),
        None => Err(Shared::abandoned("batch").into()),
    }
}

impl Slurm for Batching {
    fn ensure_tenant<'a>(&'a self, spec: &'a TenantSpec) -> SlurmFuture<'a, Ensured> {
        self.inner.ensure_tenant(spec)
    }
    fn ensure_account<'a>(&'a self, spec: &'a AccountSpec) -> SlurmFuture<'a, Ensured> {
        self.inner.ensure_account(spec)
    }
    fn ensure_user<'a>(&'a self, spec: &'a UserSpec) -> SlurmFuture<'a, Ensured> {
        self.inner.ensure_user(spec)
    }
    fn add_users<'a>(
        &'a self,
        account: &'a SlurmAccount,
        users: &'a [Username],
        default_account: bool,
        limits: &'a UserLimits,
    ) -> SlurmFuture<'a, Ensured> {
        Box::pin(self.add(account, users, default_account, limits))
    }
    fn ensure_qos<'a>(&'a self, specs: &'a [QosSpec]) -> SlurmFuture<'a, Ensured> {
        self.inner.ensure_qos(specs)
    }
    fn qos<'a>(&'a self, names: &'a [crate::domain::names::QosName]) -> SlurmFuture<'a, Vec<QosState>> {
        self.inner.qos(names)
    }
    fn user<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Option<UserState>> {
        Box::pin(self.user_shared(user))
    }
    fn users<'a>(&'a self, users: &'a [Username]) -> SlurmFuture<'a, BTreeMap<String, UserState>> {
        self.inner.users(users)
    }
    fn associations<'a>(&'a self, accounts: &'a [SlurmAccount]) -> SlurmFuture<'a, Vec<Association>> {
        Box::pin(self.associations_shared(accounts))
    }
    fn block_user<'a>(&'a self, user: &'a Username, accounts: &'a [SlurmAccount]) -> SlurmFuture<'a, Ensured> {
        self.inner.block_user(user, accounts)
    }
    fn unblock_user<'a>(
        &'a self,
        user: &'a Username,
        accounts: &'a [SlurmAccount],
        limits: &'a UserLimits,
    ) -> SlurmFuture<'a, Ensured> {
        self.inner.unblock_user(user, accounts, limits)
    }
    fn block_account<'a>(&'a self, account: &'a SlurmAccount) -> SlurmFuture<'a, Ensured> {
        self.inner.block_account(account)
    }
    fn unblock_account<'a>(&'a self, account: &'a SlurmAccount, grp_jobs: Limit) -> SlurmFuture<'a, Ensured> {
        self.inner.unblock_account(account, grp_jobs)
    }
    fn jobs<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Vec<SlurmJob>> {
        self.inner.jobs(scope)
    }
    fn cancel_pending<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Cancelled> {
        self.inner.cancel_pending(scope)
    }
    fn cancel_all<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, Cancelled> {
        self.inner.cancel_all(scope)
    }
    fn archive_dump<'a>(&'a self, dir: &'a HostPath) -> SlurmFuture<'a, ArchiveReport> {
        self.inner.archive_dump(dir)
    }
    fn export_records<'a>(&'a self, scope: &'a JobScope, path: &'a HostPath) -> SlurmFuture<'a, RecordsExport> {
        self.inner.export_records(scope, path)
    }
    fn records_file<'a>(&'a self, path: &'a HostPath) -> SlurmFuture<'a, Option<RecordsFile>> {
        self.inner.records_file(path)
    }
    fn count_records<'a>(&'a self, scope: &'a JobScope) -> SlurmFuture<'a, u64> {
        self.inner.count_records(scope)
    }
    fn user_record<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Option<UserRecord>> {
        self.inner.user_record(user)
    }
    fn delete_user_association<'a>(
        &'a self,
        user: &'a Username,
        account: &'a SlurmAccount,
    ) -> SlurmFuture<'a, Deleted> {
        self.inner.delete_user_association(user, account)
    }
    fn delete_user<'a>(&'a self, user: &'a Username) -> SlurmFuture<'a, Deleted> {
        self.inner.delete_user(user)
    }
    fn delete_account<'a>(&'a self, account: &'a SlurmAccount) -> SlurmFuture<'a, Deleted> {
        self.inner.delete_account(account)
    }
    fn config(&self) -> SlurmFuture<'_, BTreeMap<String, String>> {
        self.inner.config()
    }
    fn read_file<'a>(&'a self, path: &'a HostPath) -> SlurmFuture<'a, Option<String>> {
        self.inner.read_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::record::RecordingTransport;
    use crate::domain::names::ClusterName;
    use crate::dryrun::sim::World;
    use crate::effects::EffectLog;

    #[tokio::test]
    async fn concurrent_additions_to_one_account_are_one_command() {
        let cluster = ClusterName::parse("c").unwrap();
        let world = World::new(&cluster, crate::backends::kubernetes::K8sSettings::default());
        let log = EffectLog::default();
        let cli = SlurmCli::new(RecordingTransport::wrap("slurm", world.slurm_host(), &log), cluster);
        let account = SlurmAccount::parse("ml").unwrap();
        let spec = AccountSpec {
            name: account.clone(),
            parent: None,
            description: SlurmText::parse("ml").unwrap(),
            organization: SlurmText::parse("ml").unwrap(),
            limits: AccountLimits::default(),
        };
        cli.ensure_account(&spec).await.unwrap();
        let b = Arc::new(Batching::new(Arc::new(cli), Duration::from_millis(200)));
        let limits = UserLimits { max_jobs: Some(Limit::At(5)), ..Default::default() };
        let mut tasks = vec![];
        for name in ["alice", "bob", "erin"] {
            let (b, account, limits) = (b.clone(), account.clone(), limits.clone());
            // each as a step attempt would run it, collecting its effects
            tasks.push(tokio::spawn(crate::effects::collect(async move {
                let u = [Username::parse(name).unwrap()];
                b.add_users(&account, &u, true, &limits).await
            })));
        }
        for (t, name) in tasks.into_iter().zip(["alice", "bob", "erin"]) {
            let (r, effects) = t.await.unwrap();
            let ensured = r.unwrap();
            assert_eq!(ensured.created, vec![name.to_string()], "each caller sees its own user");
            // the record the batch's read-back found, of this caller's user only
            assert_eq!(ensured.users.keys().collect::<Vec<_>>(), [name], "{:?}", ensured.users);
            let assoc = ensured.users[name].assocs.iter().find(|a| a.account == "ml");
            assert_eq!(assoc.map(|a| &a.max_jobs), Some(&Limit::At(5)), "{:?}", ensured.users);
            let calls: Vec<&str> = effects.iter().filter_map(|e| e["call"].as_str()).collect();
            assert!(
                calls.iter().any(|c| c.starts_with("sacctmgr -i add user alice,bob,erin")),
                "every member's attempt records the batch's command: {calls:?}"
            );
        }
        let adds: Vec<String> =
            log.writes().into_iter().map(|e| e.call).filter(|c| c.starts_with("sacctmgr -i add user")).collect();
        assert_eq!(adds.len(), 1, "{adds:?}");
        assert!(adds[0].starts_with("sacctmgr -i add user alice,bob,erin Account=ml"), "{adds:?}");

        // later, alone: its own call
        let u = [Username::parse("frank").unwrap()];
        assert_eq!(b.add_users(&account, &u, true, &limits).await.unwrap().created, ["frank"]);
        assert_eq!(log.writes().iter().filter(|e| e.call.starts_with("sacctmgr -i add user")).count(), 2);
        // again, with nothing left to do: no write, and the record its read found
        let again = b.add_users(&account, &u, true, &limits).await.unwrap();
        assert!(again.is_noop(), "{again:?}");
        assert_eq!(again.users.get("frank").map(|s| s.default_account.as_str()), Some("ml"), "{again:?}");
        assert_eq!(log.writes().iter().filter(|e| e.call.starts_with("sacctmgr -i add user")).count(), 2);

        // concurrent association reads share one `show assoc`, and each caller's read began after
        // it asked: the users added just before are in every answer
        let reads = || log.all().iter().filter(|e| e.call.contains(" show assoc")).count();
        let before = reads();
        let mut tasks = vec![];
        for _ in 0..50 {
            let (b, accounts) = (b.clone(), vec![account.clone()]);
            tasks.push(tokio::spawn(crate::effects::collect(async move { b.associations(&accounts).await })));
        }
        for t in tasks {
            let (r, effects) = t.await.unwrap();
            let users: Vec<String> = r.unwrap().into_iter().map(|a| a.user).filter(|u| !u.is_empty()).collect();
            assert_eq!(users, ["alice", "bob", "erin", "frank"]);
            assert!(effects.iter().any(|e| e["call"].as_str().is_some_and(|c| c.contains(" show assoc"))));
        }
        assert_eq!(reads() - before, 1, "fifty callers, one read");
        let u = [Username::parse("grace").unwrap()];
        b.add_users(&account, &u, true, &limits).await.unwrap();
        let users = b.associations(std::slice::from_ref(&account)).await.unwrap();
        assert!(users.iter().any(|a| a.user == "grace"), "a later caller gets a later read");

        // concurrent single-user reads are one `show user` of all of them; each gets its own
        let reads = || log.all().iter().filter(|e| e.call.contains(" show user")).count();
        let before = reads();
        let mut tasks = vec![];
        for name in ["alice", "bob", "grace", "nobody", "alice"] {
            let b = b.clone();
            tasks.push(tokio::spawn(crate::effects::collect(async move {
                (name, b.user(&Username::parse(name).unwrap()).await)
            })));
        }
        for t in tasks {
            let ((name, r), effects) = t.await.unwrap();
            let state = r.unwrap();
            if name == "nobody" {
                assert!(state.is_none(), "{state:?}");
            } else {
                let state = state.unwrap_or_else(|| panic!("{name} is in Slurm"));
                assert_eq!(state.default_account, "ml");
                assert!(state.assocs.iter().all(|a| a.user == name && a.account == "ml"), "{name}: {state:?}");
            }
            assert!(effects.iter().any(|e| e["call"].as_str().is_some_and(|c| c.contains(" show user"))));
        }
        assert_eq!(reads() - before, 1, "five callers, one read");
    }
}

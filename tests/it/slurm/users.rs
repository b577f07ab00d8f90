//! User associations: converge, default account, one-call batches (and their cost).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use onramp::backends::exec::{Command, RunFuture, Transport};

use super::*;

#[tokio::test]
async fn user_associations_converge_and_the_default_account_moves_before_a_delete() {
    let s = slurm();
    let (t, a, b, u) = (uniq("t"), uniq("a"), uniq("b"), uniq("u"));
    let _c = Cleanup { accounts: vec![a.clone(), b.clone(), t.clone()], users: vec![u.clone()] };
    s.ensure_tenant(&tenant(&t, &[&a, &b])).await.unwrap();
    let mut spec = UserSpec { user: user(&u), account: acct(&a), default_account: true, limits: user_limits() };

    assert_eq!(s.ensure_user(&spec).await.unwrap().created, vec![u.clone()]);
    assert!(s.ensure_user(&spec).await.unwrap().is_noop());
    let st = s.user(&user(&u)).await.unwrap().unwrap();
    assert_eq!(st.default_account, a);
    let x = assoc(&st.assocs, &a, &u);
    assert_eq!((x.fairshare, x.max_jobs, x.default_qos.as_str()), (Fairshare::Parent, Limit::At(20), "normal"));
    assert_eq!(x.grp_tres_mins.get("gres/gpu"), Some(10000));

    spec.limits.max_jobs = Some(Limit::At(5));
    spec.limits.grp_tres_mins = Some(Tres::gpus(500));
    spec.limits.grp_jobs = Some(Limit::At(7));
    let ch = s.ensure_user(&spec).await.unwrap();
    assert_eq!(ch.changed, [format!("{u}: MaxJobs"), format!("{u}: GrpJobs"), format!("{u}: GrpTRESMins")]);
    assert!(s.ensure_user(&spec).await.unwrap().is_noop());
    let x = s.user(&user(&u)).await.unwrap().unwrap().assocs.into_iter().find(|x| x.account == a).unwrap();
    assert_eq!((x.max_jobs, x.grp_jobs, x.grp_tres_mins.get("gres/gpu")), (Limit::At(5), Limit::At(7), Some(500)));

    // A second association that is not the default; then the default one goes: the default moves first.
    let second = UserSpec { account: acct(&b), default_account: false, ..spec.clone() };
    assert_eq!(s.ensure_user(&second).await.unwrap().created, vec![u.clone()]);
    assert_eq!(s.user(&user(&u)).await.unwrap().unwrap().default_account, a);
    assert!(matches!(s.delete_user_association(&user(&u), &acct(&a)).await.unwrap(), Deleted::Deleted { .. }));
    assert_eq!(s.delete_user_association(&user(&u), &acct(&a)).await.unwrap(), Deleted::AlreadyGone);
    let st = s.user(&user(&u)).await.unwrap().unwrap();
    assert_eq!((st.default_account.as_str(), st.assocs.len()), (b.as_str(), 1));

    // Mistakes are permanent.
    let bad = UserSpec { account: acct(&uniq("nope")), ..spec.clone() };
    assert!(matches!(s.ensure_user(&bad).await.unwrap_err(), SlurmError::MissingAccount(_)));
    let mut bad = second.clone();
    bad.limits.qos = Some(vec![qos("nosuchqos")]);
    bad.limits.default_qos = None;
    let e = s.ensure_user(&bad).await.unwrap_err();
    assert!(matches!(e, SlurmError::UnknownQos { .. }) && !e.is_retryable(), "{e:?}");

    assert!(matches!(s.delete_user(&user(&u)).await.unwrap(), Deleted::Deleted { .. }));
    assert_eq!(s.delete_user(&user(&u)).await.unwrap(), Deleted::AlreadyGone);
    assert_eq!(s.user(&user(&u)).await.unwrap(), None);
}

/// Runs commands here and keeps a copy of each.
#[derive(Default)]
struct Counting {
    seen: Mutex<Vec<Command>>,
}

impl Counting {
    fn count(&self, words: &[&str]) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.iter().filter(|c| words.iter().all(|w| c.argv().iter().any(|a| a == w))).count()
    }
}

impl Transport for Counting {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        self.seen.lock().unwrap().push(cmd.clone());
        LOCAL.run(cmd, timeout)
    }
}

#[tokio::test]
async fn many_users_are_added_in_one_call_and_converged_in_one_more() {
    cluster_up();
    let counting = Arc::new(Counting::default());
    let s = SlurmCli::new(counting.clone(), cluster()).with_write_gate(writes());
    let (t, a) = (uniq("t"), uniq("a"));
    let users: Vec<String> = (0..30).map(|i| uniq(&format!("b{i}"))).collect();
    let singles: Vec<String> = (0..3).map(|i| uniq(&format!("s{i}"))).collect();
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: users.iter().chain(&singles).cloned().collect() };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let names: Vec<Username> = users.iter().map(|u| user(u)).collect();

    // A few exist already, with other limits: they are converged, the rest added, in one call each.
    let early = UserLimits { max_jobs: Some(Limit::At(3)), ..Default::default() };
    s.add_users(&acct(&a), &names[..2], true, &early).await.unwrap();
    let before = counting.seen.lock().unwrap().len();
    let t0 = Instant::now();
    let done = s.add_users(&acct(&a), &names, true, &user_limits()).await.unwrap();
    let batched = t0.elapsed();
    assert_eq!(done.created.len(), 28);
    assert_eq!(done.changed.len(), 2 * 4, "{:?}", done.changed); // Fairshare, QOS, DefaultQOS, MaxJobs, GrpTRESMins minus QOS (normal by default)
    let cmds = counting.seen.lock().unwrap()[before..].to_vec();
    assert_eq!(cmds.len(), 4, "read, add, modify, read back: {cmds:#?}");
    assert!(cmds[1].argv()[4].split(',').count() == 28);

    let again = Instant::now();
    assert!(s.add_users(&acct(&a), &names, true, &user_limits()).await.unwrap().is_noop());
    let noop = again.elapsed();
    let all = s.associations(&[acct(&a)]).await.unwrap();
    assert_eq!(all.iter().filter(|x| !x.user.is_empty() && x.max_jobs == Limit::At(20)).count(), 30);

    // The same work one user at a time, for the figures.
    let t1 = Instant::now();
    for u in &singles {
        let spec = UserSpec { user: user(u), account: acct(&a), default_account: true, limits: user_limits() };
        s.ensure_user(&spec).await.unwrap();
    }
    let per_user = t1.elapsed() / singles.len() as u32;
    eprintln!(
        "slurm batch: 30 users (28 added + 2 converged) in one add_users: {batched:?} ({} sacctmgr calls); \
         re-run (no-op): {noop:?}; one by one with ensure_user: {per_user:?} per user (~{:?} for 30)",
        cmds.len(),
        per_user * 30
    );
    assert_eq!(counting.count(&["add", "user"]), 1 + 1 + 3);
}

/// Runs commands here; each write's reply is lost after it ran (exit 1 with an error sacctmgr
/// does not name), or with `refuse` the write fails so without running.
struct LostReply {
    refuse: bool,
}

impl Transport for LostReply {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        Box::pin(async move {
            let write = cmd.argv().iter().any(|a| a == "-i");
            if write && self.refuse {
                return Ok(onramp::backends::exec::Output {
                    code: 1,
                    stdout: String::new(),
                    stderr: " Error: boom\n".into(),
                });
            }
            let mut out = LOCAL.run(cmd, timeout).await?;
            if write {
                out.code = 1;
                out.stderr.push_str(" Error: the reply was lost\n");
            }
            Ok(out)
        })
    }
}

#[tokio::test]
async fn a_write_that_exits_1_after_its_change_holds_is_done_and_one_that_did_not_keeps_its_error() {
    let s = slurm();
    let (t, a, u, v) = (uniq("t"), uniq("a"), uniq("u"), uniq("v"));
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![u.clone(), v.clone()] };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let lost = SlurmCli::new(Arc::new(LostReply { refuse: false }), cluster()).with_write_gate(writes());
    let spec = UserSpec { user: user(&u), account: acct(&a), default_account: true, limits: user_limits() };
    assert_eq!(lost.ensure_user(&spec).await.unwrap().created, vec![u.clone()]);
    assert!(lost.ensure_user(&spec).await.unwrap().is_noop());
    let assocs = s.associations(&[acct(&a)]).await.unwrap();
    assert_eq!(assocs.iter().filter(|x| x.user == u).count(), 1, "{assocs:?}");

    let refused = SlurmCli::new(Arc::new(LostReply { refuse: true }), cluster()).with_write_gate(writes());
    let spec = UserSpec { user: user(&v), ..spec };
    let e = refused.ensure_user(&spec).await.unwrap_err();
    assert!(
        matches!(&e, SlurmError::Failed { code: 1, detail, .. } if detail.contains("boom")) && !e.is_retryable(),
        "{e:?}"
    );
}

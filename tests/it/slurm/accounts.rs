//! Tenant accounts: ensure, converge, block, delete with children; permanent mistakes.

use super::*;

#[tokio::test]
async fn tenant_accounts_are_ensured_idempotently_converged_blocked_and_deleted_with_children() {
    let s = slurm();
    let (t, a, b) = (uniq("t"), uniq("ml"), uniq("data"));
    let _c = Cleanup { accounts: vec![a.clone(), b.clone(), t.clone()], users: vec![] };
    let mut spec = tenant(&t, &[&a, &b]);

    let first = s.ensure_tenant(&spec).await.unwrap();
    assert_eq!(first.created, [t.clone(), a.clone(), b.clone()]);
    assert!(s.ensure_tenant(&spec).await.unwrap().is_noop(), "second run changes nothing");
    let names = [acct(&t), acct(&a), acct(&b)];
    let all = s.associations(&names).await.unwrap();
    let ta = assoc(&all, &t, "");
    assert_eq!((ta.parent.as_str(), ta.fairshare, ta.grp_jobs), ("root", Fairshare::Shares(300), Limit::At(200)));
    assert_eq!((ta.grp_tres.get("gres/gpu"), ta.grp_tres.get("cpu")), (Some(4), Some(8)));
    assert_eq!(assoc(&all, &a, "").parent, t);

    // Converge: new limits, a TRES dropped, a limit cleared; case differences are not differences.
    spec.account.description = text("TENANT FOO");
    spec.account.limits = AccountLimits {
        fairshare: Some(Fairshare::Shares(100)),
        grp_tres: Some(Tres::gpus(8)),
        grp_jobs: Some(Limit::Unlimited),
    };
    spec.teams[1].description = text("Data Team");
    let changed = s.ensure_tenant(&spec).await.unwrap();
    assert_eq!(
        changed.changed,
        [format!("{t}: Fairshare"), format!("{t}: GrpTRES"), format!("{t}: GrpJobs"), format!("{b}: Description")]
    );
    assert!(s.ensure_tenant(&spec).await.unwrap().is_noop());
    let all = s.associations(&names).await.unwrap();
    let ta = assoc(&all, &t, "");
    assert_eq!(
        (ta.fairshare, ta.grp_jobs, ta.grp_tres.to_string().as_str()),
        (Fairshare::Shares(100), Limit::Unlimited, "gres/gpu=8")
    );

    // Block and unblock the tenant, twice each.
    assert_eq!(s.block_account(&acct(&t)).await.unwrap().changed, ["GrpJobs", "GrpSubmitJobs"]);
    assert!(s.block_account(&acct(&t)).await.unwrap().is_noop());
    assert!(assoc(&s.associations(&names).await.unwrap(), &t, "").is_blocked());
    assert!(!s.unblock_account(&acct(&t), Limit::At(50)).await.unwrap().is_noop());
    assert!(s.unblock_account(&acct(&t), Limit::At(50)).await.unwrap().is_noop());
    assert_eq!(assoc(&s.associations(&names).await.unwrap(), &t, "").grp_jobs, Limit::At(50));

    // Deleting the tenant deletes the team accounts too (rows and all), once.
    let gone = s.delete_account(&acct(&t)).await.unwrap();
    assert!(matches!(&gone, Deleted::Deleted { removed } if removed.len() == 3), "{gone:?}");
    assert_eq!(s.delete_account(&acct(&t)).await.unwrap(), Deleted::AlreadyGone);
    let rows = std::process::Command::new("sacctmgr")
        .args(["-n", "-P", "show", "account", "where", &format!("name={t},{a},{b}"), "format=account"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&rows.stdout), "", "no account rows left behind");
}

#[tokio::test]
async fn account_mistakes_are_permanent_errors() {
    let s = slurm();
    let (t, x) = (uniq("t"), uniq("x"));
    let _c = Cleanup { accounts: vec![x.clone(), t.clone()], users: vec![] };
    let mut spec = tenant(&t, &[]).account;
    spec.name = acct(&x);
    spec.parent = Some(acct(&uniq("nope")));
    let e = s.ensure_account(&spec).await.unwrap_err();
    assert!(matches!(e, SlurmError::MissingParent(_)) && !e.is_retryable(), "{e:?}");

    spec.parent = None;
    spec.limits.grp_tres = Some(Tres::new().with("gres/foo", 3).unwrap());
    let e = s.ensure_account(&spec).await.unwrap_err();
    assert!(matches!(e, SlurmError::UnknownTres { .. }) && !e.is_retryable(), "{e:?}");

    // A team whose name is taken elsewhere in the tree is a conflict, not a move.
    let mut other = tenant(&t, &[]);
    s.ensure_tenant(&other).await.unwrap();
    spec.limits.grp_tres = None;
    s.ensure_account(&spec).await.unwrap();
    let mut team = spec.clone();
    team.parent = Some(acct(&t));
    other.teams.push(team);
    let e = s.ensure_tenant(&other).await.unwrap_err();
    assert!(matches!(e, SlurmError::Conflict(_)), "{e:?}");
    other.teams[0].parent = None;
    assert!(matches!(s.ensure_tenant(&other).await.unwrap_err(), SlurmError::Invalid(_)));
}

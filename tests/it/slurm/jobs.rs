//! Real jobs of real unix users: submit, block, cancel, refuse deletes; archive.

use std::time::Duration;

use super::*;
use crate::common::eventually;

#[tokio::test]
async fn a_real_user_can_submit_until_blocked_and_again_after_unblock() {
    let s = slurm();
    let (t, a, unix) = (uniq("t"), uniq("a"), "onramp-alice");
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![] };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let spec = UserSpec { user: user(unix), account: acct(&a), default_account: false, limits: user_limits() };
    s.ensure_user(&spec).await.unwrap();
    let _u = Cleanup { accounts: vec![], users: vec![] };
    let test_only =
        || runuser(unix, &["sbatch", "--test-only", &format!("--account={a}"), "--time=1", "--wrap", "true"]);
    let o = test_only();
    assert!(o.status.success() && String::from_utf8_lossy(&o.stderr).contains("to start at"), "{o:?}");

    assert!(!s.block_user(&user(unix), &[acct(&a)]).await.unwrap().is_noop());
    assert!(s.block_user(&user(unix), &[acct(&a)]).await.unwrap().is_noop());
    assert!(assoc(&s.associations(&[acct(&a)]).await.unwrap(), &a, unix).is_blocked());
    let o = runuser(unix, &["sbatch", &format!("--account={a}"), "--time=1", "-o", "/dev/null", "--wrap", "true"]);
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    if o.status.success() {
        // Accepted: it must pend on the association's job limits.
        let jobs = s.jobs(&JobScope::Account(acct(&a))).await.unwrap();
        assert!(
            jobs.iter().all(|j| j.reason.starts_with("AssocGrpJobsLimit") || j.reason.starts_with("AssocMaxJobsLimit")),
            "{jobs:?}"
        );
    } else {
        assert!(err.contains("AssocMaxSubmitJobLimit"), "{err}");
    }

    let limits = user_limits();
    assert!(!s.unblock_user(&user(unix), &[acct(&a)], &limits).await.unwrap().is_noop());
    assert!(s.unblock_user(&user(unix), &[acct(&a)], &limits).await.unwrap().is_noop());
    let x = assoc(&s.associations(&[acct(&a)]).await.unwrap(), &a, unix).clone();
    assert_eq!((x.max_jobs, x.grp_jobs, x.max_submit_jobs), (Limit::At(20), Limit::Unlimited, Limit::Unlimited));
    assert!(test_only().status.success());

    // The tenant block caps every team below it.
    s.block_account(&acct(&t)).await.unwrap();
    let o = runuser(unix, &["sbatch", &format!("--account={a}"), "--time=1", "-o", "/dev/null", "--wrap", "true"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("AssocGrpSubmitJobsLimit"), "{o:?}");
    s.unblock_account(&acct(&t), Limit::At(200)).await.unwrap();
    assert!(test_only().status.success());

    assert!(matches!(s.delete_user_association(&user(unix), &acct(&a)).await.unwrap(), Deleted::Deleted { .. }));
    s.delete_account(&acct(&t)).await.unwrap();
}

fn sbatch(unix: &str, account: &str, cpus: &str) -> String {
    let o = runuser(
        unix,
        &[
            "sbatch",
            "--parsable",
            &format!("--account={account}"),
            "-c",
            cpus,
            "--time=5",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        ],
    );
    assert!(o.status.success(), "sbatch: {o:?}");
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[tokio::test]
async fn pending_jobs_are_cancelled_running_ones_survive_and_a_user_with_jobs_is_not_deleted() {
    let s = slurm();
    let (t, a, unix) = (uniq("t"), uniq("a"), "onramp-bob");
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![] };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let spec = UserSpec { user: user(unix), account: acct(&a), default_account: true, limits: user_limits() };
    s.ensure_user(&spec).await.unwrap();
    let bob = JobScope::User(user(unix));
    let _node = NODE.lock().await;

    let running = sbatch(unix, &a, "2");
    eventually(Duration::from_secs(60), "the first job to run", || async {
        let j = s.jobs(&bob).await.unwrap();
        j.iter().any(|j| j.id == running && j.state == SlurmJobState::Running).then_some(())
    })
    .await;
    // The tenant's GrpTRES caps it at 8 CPUs: 2 running + 7 more cannot start, whenever the
    // scheduler looks (two jobs of 2 CPUs raced it: the second sometimes started at once).
    let pending = sbatch(unix, &a, "7");
    let jobs = s.jobs(&JobScope::Account(acct(&a))).await.unwrap();
    assert!(jobs.iter().any(|j| j.id == pending && j.state == SlurmJobState::Pending), "{jobs:?}");

    let c = s.cancel_pending(&bob).await.unwrap();
    assert_eq!(c.cancelled, vec![pending.clone()]);
    assert_eq!(s.cancel_pending(&bob).await.unwrap(), Cancelled::default());
    let jobs = s.jobs(&bob).await.unwrap();
    assert_eq!(
        jobs.iter().map(|j| (j.id.clone(), j.state.clone())).collect::<Vec<_>>(),
        [(running.clone(), SlurmJobState::Running)]
    );

    for e in [s.delete_user(&user(unix)).await.unwrap_err(), s.delete_account(&acct(&t)).await.unwrap_err()] {
        assert!(matches!(&e, SlurmError::JobsActive { jobs, .. } if jobs == std::slice::from_ref(&running)), "{e:?}");
    }
    assert!(s.user(&user(unix)).await.unwrap().is_some(), "still there");

    let c = s.cancel_all(&JobScope::Account(acct(&t))).await.unwrap();
    assert!(c.cancelled.contains(&running) || c.remaining.iter().any(|j| j.id == running), "{c:?}");
    eventually(Duration::from_secs(60), "the job to end", || async {
        s.jobs(&bob).await.unwrap().is_empty().then_some(())
    })
    .await;
    drop(_node);
    let tenant_jobs = JobScope::Account(acct(&t));
    assert_eq!(s.cancel_all(&tenant_jobs).await.unwrap(), Cancelled::default());
    // slurmdbd learns of the job's end a moment after slurmctld: the refusal is retryable.
    let gone = eventually(Duration::from_secs(30), "the delete to be accepted", || async {
        match s.delete_user(&user(unix)).await {
            Ok(d) => Some(d),
            Err(e) if e.is_retryable() => None,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
    assert!(matches!(gone, Deleted::Deleted { .. }), "{gone:?}");
    assert_eq!(s.delete_user(&user(unix)).await.unwrap(), Deleted::AlreadyGone);
    assert!(matches!(s.delete_account(&acct(&t)).await.unwrap(), Deleted::Deleted { .. }));
}

#[tokio::test]
async fn archive_dump_reports_what_it_really_wrote() {
    let s = slurm();
    let dir = std::env::temp_dir().join(uniq("archive"));
    std::fs::create_dir_all(&dir).unwrap();
    let ok = std::process::Command::new("chown").args(["slurm", dir.to_str().unwrap()]).status().unwrap();
    assert!(ok.success());
    let path = HostPath::parse(dir.to_str().unwrap()).unwrap();
    for _ in 0..2 {
        let r = s.archive_dump(&path).await.unwrap();
        // The test cluster sets no Purge*After: "SUCCESS", and nothing written.
        assert!(r.message.contains("SUCCESS"), "{r:?}");
        assert_eq!(r.written, Vec::<String>::new());
    }
    std::fs::remove_dir_all(&dir).unwrap();
    let e = s.archive_dump(&path).await.unwrap_err();
    assert!(!e.is_retryable(), "{e:?}");
}

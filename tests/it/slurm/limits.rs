//! The limits onramp sets, shown to bite with real jobs of real unix users (set up through
//! onramp's own backend): a tenant held at its GPU cap, a user at MaxJobs, a blocked user refused,
//! and a user without an association refused by Slurm and named by the reconcile's report.

use std::time::Duration;

use onramp::engine::Actor;
use serde_json::Value;

use super::*;
use crate::common::{eventually, wait_state};
use crate::flows_support::{CAROL, Harness, UNIX_USER, short};

/// sbatch as `unix`: the job id, or sbatch's exit code and stderr.
fn submit(unix: &str, account: &str, extra: &[&str]) -> Result<String, (i32, String)> {
    let mut args = vec!["sbatch", "--parsable", "-o", "/dev/null", "--time=5", "-c", "1"];
    let acct = format!("--account={account}");
    args.push(&acct);
    args.extend(extra);
    args.extend(["--wrap", "sleep 300"]);
    let o = runuser(unix, &args);
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    } else {
        Err((o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).trim().to_string()))
    }
}

/// Waits until the account's jobs are `running` running and the rest pending for `reason`.
async fn wait_held(s: &SlurmCli, account: &str, ids: &[String], running: usize, reason: &str) -> Vec<SlurmJob> {
    eventually(Duration::from_secs(60), &format!("{running} running, the rest pending on {reason}"), || async {
        let jobs = s.jobs(&JobScope::Account(acct(account))).await.unwrap();
        let ours: Vec<SlurmJob> = jobs.into_iter().filter(|j| ids.contains(&j.id)).collect();
        let run = ours.iter().filter(|j| j.state == SlurmJobState::Running).count();
        let held = ours.iter().filter(|j| j.state == SlurmJobState::Pending && j.reason == reason).count();
        (ours.len() == ids.len() && run == running && held == ids.len() - running).then_some(ours)
    })
    .await
}

/// Cancels the account's jobs and waits until slurmctld and slurmdbd let the accounts go.
async fn end_jobs_and_delete(s: &SlurmCli, tenant: &str) {
    s.cancel_all(&JobScope::Account(acct(tenant))).await.unwrap();
    eventually(Duration::from_secs(60), "the tenant's jobs to end and its accounts to go", || async {
        match s.delete_account(&acct(tenant)).await {
            Ok(d) => Some(d),
            Err(e) if e.is_retryable() => None,
            Err(e) => panic!("{e}"),
        }
    })
    .await;
}

#[tokio::test]
async fn a_tenant_at_its_gpu_cap_runs_four_one_gpu_jobs_and_holds_the_fifth() {
    let s = slurm();
    let (t, a, unix) = (uniq("t"), uniq("a"), "onramp-alice");
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![] };
    // GrpTRES=gres/gpu=4 (and cpu=8) on the tenant; the job is charged to its team account.
    let spec = tenant(&t, &[&a]);
    assert_eq!(spec.account.limits.grp_tres.as_ref().and_then(|g| g.get("gres/gpu")), Some(4));
    s.ensure_tenant(&spec).await.unwrap();
    let u = UserSpec { user: user(unix), account: acct(&a), default_account: false, limits: user_limits() };
    s.ensure_user(&u).await.unwrap();
    let _node = NODE.lock().await;

    let ids: Vec<String> = (0..5).map(|_| submit(unix, &a, &["--gres=gpu:1"]).unwrap()).collect();
    let jobs = wait_held(&s, &a, &ids, 4, "AssocGrpGRES").await;
    assert_eq!(jobs.iter().filter(|j| j.reason == "AssocGrpGRES").count(), 1, "{jobs:?}");

    end_jobs_and_delete(&s, &t).await;
}

#[tokio::test]
async fn a_user_at_max_jobs_runs_one_job_and_holds_the_second() {
    let s = slurm();
    let (t, a, unix) = (uniq("t"), uniq("a"), "onramp-bob");
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![] };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let limits = UserLimits { max_jobs: Some(Limit::At(1)), ..user_limits() };
    s.ensure_user(&UserSpec { user: user(unix), account: acct(&a), default_account: false, limits }).await.unwrap();
    assert_eq!(assoc(&s.associations(&[acct(&a)]).await.unwrap(), &a, unix).max_jobs, Limit::At(1));
    let _node = NODE.lock().await;

    let ids: Vec<String> = (0..2).map(|_| submit(unix, &a, &[]).unwrap()).collect();
    wait_held(&s, &a, &ids, 1, "AssocMaxJobsLimit").await;

    end_jobs_and_delete(&s, &t).await;
}

#[tokio::test]
async fn a_blocked_user_is_refused_by_sbatch_and_submits_again_once_unblocked() {
    let s = slurm();
    let (t, a, unix) = (uniq("t"), uniq("a"), "onramp-dave");
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![] };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let spec = UserSpec { user: user(unix), account: acct(&a), default_account: false, limits: user_limits() };
    s.ensure_user(&spec).await.unwrap();
    s.block_user(&user(unix), &[acct(&a)]).await.unwrap();

    let (code, err) = submit(unix, &a, &["--test-only"]).unwrap_err();
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("AssocMaxSubmitJobLimit"), "{err}");
    assert!(err.contains("Job violates accounting/QOS policy (job submit limit"), "{err}");
    // a real submission too, not only the test
    let (code, err) = submit(unix, &a, &[]).unwrap_err();
    assert_eq!((code, err.contains("AssocMaxSubmitJobLimit")), (1, true), "{err}");
    assert!(err.contains("Batch job submission failed: Job violates accounting/QOS policy"), "{err}");

    s.unblock_user(&user(unix), &[acct(&a)], &user_limits()).await.unwrap();
    submit(unix, &a, &["--test-only"]).unwrap();
    end_jobs_and_delete(&s, &t).await;
}

/// Every object under `v` (depth first) for which `f` holds.
fn find<'a>(v: &'a Value, f: &dyn Fn(&Value) -> bool, out: &mut Vec<&'a Value>) {
    if f(v) {
        out.push(v);
    }
    match v {
        Value::Array(a) => a.iter().for_each(|x| find(x, f, out)),
        Value::Object(o) => o.values().for_each(|x| find(x, f, out)),
        _ => {}
    }
}

#[tokio::test]
async fn a_member_without_an_association_gets_invalid_account_and_the_drift_report_names_them() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    // carol is an active member of the tenant's group; Slurm has no association for her there
    h.add_carol(true);
    let err = h.sbatch(&["--test-only"]).unwrap_err();
    assert!(err.contains("Invalid account"), "the runbook's failure mode: {err}");

    let job = onramp::flows::reconcile::tenant_job(&h.tenant, Actor::cli("test"), "drift check");
    let id = h.engine.enqueue(&[job]).await.unwrap()[0].id;
    let j = wait_state(&h.engine, id, "succeeded", Duration::from_secs(30)).await;
    let mut named = vec![];
    let carol = |v: &Value| v["username"] == UNIX_USER && v["op"] == "onboard";
    find(&j.outputs, &carol, &mut named);
    assert_eq!(named.len(), 1, "{}", j.outputs);
    let reason = named[0]["reason"].as_str().unwrap();
    assert!(reason.contains("no association under") && reason.contains(&h.team), "{reason}");
    assert_eq!(named[0]["account"], h.team.as_str(), "{}", j.outputs);
}

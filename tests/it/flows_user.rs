//! User onboarding and offboarding end to end (see flows_support for the set-up).

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use onramp::engine::{Actor, JobState, NewJob, StepOutcome};
use onramp::flows::user_offboard::USER_OFFBOARD;
use onramp::flows::user_onboard::USER_ONBOARD;
use serde_json::{Value, json};

use crate::common::{eventually, wait_state};
use crate::flows_support::{CAROL, Harness, KEY, PK, UNIX_USER, short};

const T: Duration = Duration::from_secs(90);

pub(crate) fn onboard_job(h: &Harness) -> NewJob {
    NewJob::new(
        USER_ONBOARD,
        &format!("{}/{UNIX_USER}", h.tenant),
        json!({ "tenant": h.tenant, "account": h.team, "username": UNIX_USER, "pk": PK }),
        Actor::cli("test"),
    )
}

async fn outputs(h: &Harness, id: i64) -> Value {
    h.engine.job(id).await.unwrap().outputs
}

fn carol_rows(h: &Harness, rows: &[Vec<String>]) -> Vec<Vec<String>> {
    rows.iter().filter(|r| r[0] == h.team && r[1] == UNIX_USER).cloned().collect()
}

#[tokio::test]
async fn signed_webhook_onboards_a_user_end_to_end() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();

    assert_eq!(h.post_user_event().await.status().as_u16(), 202);
    let jobs = eventually(T, "the onboarding job", || async {
        let j = h.jobs(USER_ONBOARD).await;
        (!j.is_empty()).then_some(j)
    })
    .await;
    assert_eq!(jobs.len(), 1);
    let (id, _, input) = &jobs[0];
    assert_eq!((input["account"].as_str(), input["uid_number"].as_u64()), (Some(h.team.as_str()), Some(5003)));
    let job = wait_state(&h.engine, *id, "succeeded", T).await;

    // The association, with the tenant's user defaults, in the real Slurm.
    let rows = carol_rows(&h, &h.assocs().await);
    assert_eq!(rows.len(), 1, "{rows:?}");
    // qos: normal and the registry's own QOS (which Slurm lists first)
    let qos = format!("{},normal", h.qos);
    assert_eq!(
        (rows[0][2].as_str(), rows[0][5].as_str(), rows[0][6].as_str()),
        ("20", qos.as_str(), "parent"),
        "{rows:?}"
    );
    // $HOME owned by her numbers; the quota; the e-mail.
    let home = h.root.path().join("home").join(UNIX_USER);
    let m = std::fs::metadata(&home).unwrap();
    assert_eq!((m.uid(), m.gid(), m.mode() & 0o777), (5003, 5003, 0o700));
    assert!(
        h.storage_calls().iter().any(|c| c.join(" ").contains(&format!("quota set /home/{UNIX_USER} --hard 100GB"))),
        "{:?}",
        h.storage_calls()
    );
    let mails = eventually(Duration::from_secs(10), "the e-mail", || {
        let m = h.mails();
        async move { (!m.is_empty()).then_some(m) }
    })
    .await;
    assert_eq!(mails.len(), 1);
    assert!(mails[0].contains(&format!("To: {UNIX_USER}@example.org")), "{}", mails[0]);
    let fp = onramp::domain::sshkey::PublicKey::parse(KEY).unwrap().fingerprint();
    assert!(mails[0].contains(&fp), "{}", mails[0]);

    // Every attempt keeps the commands and requests it made.
    let runs = h.engine.step_runs(*id).await.unwrap();
    let calls = |step: &str| -> Vec<String> {
        let r = runs.iter().rev().find(|r| r.step == step && r.outcome == Some(StepOutcome::Done)).unwrap();
        let list = r.effects.as_ref().and_then(|e| e.as_array()).cloned().unwrap_or_default();
        list.iter()
            .map(|e| format!("{} {} {}", e["write"], e["system"].as_str().unwrap(), e["call"].as_str().unwrap()))
            .collect()
    };
    let assoc = calls("slurm_association");
    assert!(
        assoc.iter().any(|c| c.starts_with(&format!("true slurm sacctmgr -i add user {UNIX_USER} Account="))),
        "{assoc:?}"
    );
    assert!(calls("home_directory").iter().any(|c| c.starts_with(&format!("true login/{} mv -T", h.names.namespace))));
    assert!(calls("notify").iter().any(|c| c.starts_with("true notify send")), "{:?}", calls("notify"));
    assert!(calls("resolve_user").iter().all(|c| c.starts_with("false authentik GET")), "{:?}", calls("resolve_user"));

    // Every step is in the history, with what it did.
    let o = &job.outputs;
    assert_eq!(o["key_in_secret"]["fingerprint"], fp.as_str());
    assert_eq!(o["propagation_wait"]["waited_secs"], 0.3);
    assert_eq!(o["slurm_association"]["created"], json!([UNIX_USER]));
    assert_eq!(o["home_directory"]["created"], true);
    assert_eq!(o["key_projected"]["projected"], true);
    assert_eq!((o["smoke_test"]["uid"].as_u64(), o["smoke_test"]["gid"].as_u64()), (Some(5003), Some(5003)));
    assert!(o["smoke_test"]["sbatch"].as_str().unwrap().contains("to start at"), "{o}");
    // the same numbers through Slurm on a compute node (srun as the user, with --gres=gpu:1)
    assert_eq!(
        (o["smoke_test"]["compute"]["uid"].as_u64(), o["smoke_test"]["compute"]["gid"].as_u64()),
        (Some(5003), Some(5003))
    );
    assert_eq!(o["notify"]["sent"], true);
    let runs = h.engine.step_runs(*id).await.unwrap();
    let steps: Vec<&str> = runs.iter().map(|r| r.step.as_str()).collect();
    for s in onramp::flows::user_onboard::STEPS {
        assert!(steps.contains(s), "{s} missing in {steps:?}");
    }
    // The Secret was read in the tenant's namespace.
    assert!(
        h.k8s
            .requests()
            .iter()
            .any(|(_, u)| u.contains(&format!("/namespaces/tenant-{0}/secrets/tenant-{0}-authorized-keys", h.tenant))),
        "{:?}",
        h.k8s.requests()
    );
}

/// Runs of `step` in job `id` that ended in an error (retry or failure).
async fn failed_runs(h: &Harness, id: i64, step: &str) -> Vec<String> {
    h.engine
        .step_runs(id)
        .await
        .unwrap()
        .into_iter()
        .filter(|r| r.step == step && r.error.is_some())
        .map(|r| r.error.unwrap_or_default())
        .collect()
}

#[tokio::test]
async fn a_failure_at_each_onboarding_step_converges_without_repeating_effects() {
    use axum::http::Method;
    use onramp_fakes::k8s::Fault;
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();

    // First run: preflight's read fails; the `add user` happens but its answer is lost (the
    // effect is there, the step does not know): the retry finds it; the `mv` of $HOME fails.
    h.k8s.fault(Method::GET, "slurmctld-1/exec", Fault::Status(500, None));
    h.k8s.fault(Method::GET, "command=add", Fault::DropExec);
    h.k8s.fault(Method::GET, "command=mv", Fault::Status(500, None));
    let (first, _) = h.run_to_success(onboard_job(&h)).await;
    assert!(!failed_runs(&h, first, "preflight").await.is_empty());
    assert!(!failed_runs(&h, first, "slurm_association").await.is_empty());
    assert!(!failed_runs(&h, first, "home_directory").await.is_empty());
    let o = outputs(&h, first).await;
    assert_eq!(o["notify"]["sent"], true);

    // The user works in $HOME; nothing below may touch it.
    let home = h.root.path().join("home").join(UNIX_USER);
    std::fs::write(home.join("results.txt"), "mine\n").unwrap();
    std::fs::write(home.join(".bashrc"), "# my own\n").unwrap();
    let mut runs = 1;

    // One failure per run, each at another step; every run converges.
    type Arm = Box<dyn Fn(&Harness)>;
    let cases: Vec<(&str, Arm)> = vec![
        ("resolve_user", Box::new(|h| h.ak.lock().unwrap().fail_next.extend([(503, None), (503, None), (503, None)]))),
        ("key_in_secret", Box::new(|h| h.k8s.fault(Method::GET, "authorized-keys", Fault::Status(500, None)))),
        ("home_quota", Box::new(|h| h.fail_storage_once())),
        ("key_projected", Box::new(|h| h.k8s.fault(Method::GET, "command=cat", Fault::Status(500, None)))),
        ("smoke_test", Box::new(|h| h.k8s.fault(Method::GET, "command=runuser", Fault::Status(500, None)))),
    ];
    for (step, arm) in &cases {
        arm(&h);
        let (id, _) = h.run_to_success(onboard_job(&h)).await;
        runs += 1;
        assert!(!failed_runs(&h, id, step).await.is_empty(), "no failure was injected at {step}");
        let o = outputs(&h, id).await;
        assert_eq!(o["slurm_association"]["created"], json!([]), "{step}: {o}");
        assert_eq!(o["home_directory"]["created"], false, "{step}: {o}");
    }

    // The key is not projected in the login pod: wait, rollout restart, wait, then the runbook's
    // diagnosis; once kubelet projects it, a retry converges.
    std::fs::remove_file(h.root.path().join("keys").join(UNIX_USER)).unwrap();
    let id = h.engine.enqueue(&[onboard_job(&h)]).await.unwrap()[0].id;
    let failed = wait_state(&h.engine, id, "failed", T).await;
    let why = failed.last_error.unwrap_or_default();
    assert!(why.contains("not projected in the login pod even after a rollout restart"), "{why}");
    assert!(
        h.k8s
            .requests()
            .iter()
            .any(|(m, u)| m == Method::PATCH
                && u.contains(&format!("/namespaces/{}/deployments/login", h.names.namespace))),
        "rollout restart: {:?}",
        h.k8s.requests()
    );
    std::fs::write(h.root.path().join("keys").join(UNIX_USER), format!("{KEY}\n")).unwrap();
    h.engine.retry(id, &Actor::cli("test")).await.unwrap();
    wait_state(&h.engine, id, "succeeded", T).await;
    assert_eq!(outputs(&h, id).await["login_restart"]["restarted"], true);
    runs += 1;

    // No effect was repeated: one association, $HOME untouched, one e-mail per successful run.
    let rows = carol_rows(&h, &h.assocs().await);
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(std::fs::read_to_string(home.join("results.txt")).unwrap(), "mine\n");
    assert_eq!(std::fs::read_to_string(home.join(".bashrc")).unwrap(), "# my own\n");
    let mails = eventually(Duration::from_secs(10), "one e-mail per run", || {
        let m = h.mails();
        async move { (m.len() >= runs).then_some(m) }
    })
    .await;
    assert_eq!(mails.len(), runs);

    // The notification last: the SMTP server is gone; the onboarding stays done, the failure recorded.
    let mut h = h;
    h.smtpd.child.kill().await.unwrap();
    let (id, _) = h.run_to_success(onboard_job(&h)).await;
    let o = outputs(&h, id).await;
    assert_eq!(o["notify"]["sent"], false, "{o}");
    assert_eq!(failed_runs(&h, id, "notify").await.len(), 3);
}

fn offboard_job(h: &Harness) -> NewJob {
    NewJob::new(
        USER_OFFBOARD,
        &format!("{}/{UNIX_USER}", h.tenant),
        json!({ "tenant": h.tenant, "account": h.team, "username": UNIX_USER, "reason": "left the group" }),
        Actor::cli("test"),
    )
}

async fn onboarded(h: &Harness) {
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();
    h.run_to_success(onboard_job(h)).await;
}

#[tokio::test]
async fn offboarding_blocks_cancels_drains_keeps_archives_then_deletes() {
    let _one = CAROL.lock().await;
    let _node = crate::slurm::NODE.lock().await;
    let h = Harness::start(short()).await;
    onboarded(&h).await;
    let running = h.sbatch(&[]).unwrap();
    let pending = h.sbatch(&["--begin=now+3600"]).unwrap();
    eventually(Duration::from_secs(30), "the first job to run", || async {
        h.squeue().iter().any(|(id, st)| *id == running && st == "RUNNING").then_some(())
    })
    .await;

    h.set_member(false, true);
    let id = h.engine.enqueue(&[offboard_job(&h)]).await.unwrap()[0].id;
    // Block and cancel pending: the running job survives while draining; nothing new is accepted.
    eventually(T, "the drain to poll", || async {
        let j = h.engine.job(id).await.unwrap();
        (j.step == "drain").then_some(())
    })
    .await;
    let q = h.squeue();
    assert!(q.iter().any(|(i, s)| *i == running && s == "RUNNING"), "{q:?}");
    assert!(!q.iter().any(|(i, _)| *i == pending), "the pending job is cancelled: {q:?}");
    let refused = h.sbatch(&[]).unwrap_err();
    assert!(refused.contains("limit") || refused.contains("Job violates"), "{refused}");
    let o = h.engine.job(id).await.unwrap().outputs;
    assert_eq!(o["cancel_pending"]["cancelled"], json!([pending]), "{o}");

    // After the drain deadline: a hard cutoff needs a person.
    let j = wait_state(&h.engine, id, "needs_approval", T).await;
    let why = j.last_error.unwrap_or_default();
    assert!(why.contains(&running) && why.contains("hard cutoff"), "{why}");
    assert!(h.squeue().iter().any(|(i, _)| *i == running), "still running until approved");
    h.engine.approve(id, &Actor::cli("ops")).await.unwrap();
    let done = eventually(T, "the offboarding to end", || async {
        let j = h.engine.job(id).await.unwrap();
        matches!(j.state.as_str(), "succeeded" | "failed").then_some(j)
    })
    .await;
    assert_eq!(done.state, JobState::Succeeded, "{:?} at {}: {}", done.last_error, done.step, done.outputs);
    assert!(h.squeue().is_empty(), "{:?}", h.squeue());

    let o = &done.outputs;
    assert_eq!(o["drain"]["hard_cutoff"], true, "{o}");
    assert_eq!(o["disable_login"]["authentik"], "deactivated", "{o}");
    assert!(!h.ak.lock().unwrap().users[&PK].is_active);
    let today = time::OffsetDateTime::now_utc().date();
    let snap = format!("offboard-{UNIX_USER}-{:04}{:02}{:02}", today.year(), u8::from(today.month()), today.day());
    assert_eq!(o["snapshot_home"]["snapshot"], snap.as_str(), "{o}");
    assert!(o["archive"]["message"].as_str().unwrap().contains("SUCCESS"), "{o}");
    assert_eq!(o["delete"]["deleted"], true, "{o}");
    // In this order, with the retention timer between the disable and the snapshot.
    let runs = h.engine.step_runs(id).await.unwrap();
    let order: Vec<&str> = runs.iter().map(|r| r.step.as_str()).fold(vec![], |mut v, s| {
        if v.last() != Some(&s) {
            v.push(s);
        }
        v
    });
    assert_eq!(order, onramp::flows::user_offboard::STEPS.to_vec());
    assert!(h.storage_calls().iter().any(|c| c.join(" ").contains(&snap)), "{:?}", h.storage_calls());
    assert!(carol_rows(&h, &h.assocs().await).is_empty(), "the association is deleted");
    let mails = h.mails();
    assert!(mails.iter().any(|m| m.contains("has ended")), "{mails:?}");
}

#[tokio::test]
async fn a_user_re_added_during_retention_is_restored() {
    re_added_during_retention(false).await;
}

#[tokio::test]
async fn a_user_re_added_during_retention_is_restored_on_a_group_event() {
    re_added_during_retention(true).await;
}

/// `via_group`: the webhook names the tenant's group (a tenant reconcile), not the user.
async fn re_added_during_retention(via_group: bool) {
    let _one = CAROL.lock().await;
    let mut t = short();
    t.retention = Duration::from_secs(3600);
    let h = Harness::start(t).await;
    onboarded(&h).await;
    h.set_member(false, true);
    let off = h.engine.enqueue(&[offboard_job(&h)]).await.unwrap()[0].id;
    eventually(T, "the retention timer", || async {
        let j = h.engine.job(off).await.unwrap();
        (j.step == "retention" && j.state == JobState::Waiting).then_some(())
    })
    .await;
    assert!(h.sbatch(&["--test-only"]).is_err(), "blocked while retained");

    // Re-added (and reactivated) in Authentik; the webhook says the user changed.
    h.set_member(true, true);
    let res = if via_group { h.post_group_event().await } else { h.post_user_event().await };
    assert_eq!(res.status().as_u16(), 202);
    wait_state(&h.engine, off, "cancelled", T).await;
    let on = eventually(T, "the restoring onboarding", || async {
        let j = h.jobs(USER_ONBOARD).await;
        (j.len() == 2).then(|| j[1].0)
    })
    .await;
    let j = wait_state(&h.engine, on, "succeeded", T).await;
    assert_eq!(j.outputs["slurm_association"]["unblocked"], true, "{}", j.outputs);
    let rows = carol_rows(&h, &h.assocs().await);
    assert_eq!((rows.len(), rows[0][2].as_str(), rows[0][4].as_str()), (1, "20", ""), "{rows:?}");
    assert!(h.sbatch(&["--test-only"]).is_ok(), "can submit again");
    assert!(h.storage_calls().iter().all(|c| !c.join(" ").contains("snapshot")), "nothing was archived");
}

#[tokio::test]
async fn offboarding_from_one_tenant_leaves_the_users_other_tenant_alone() {
    use onramp::backends::slurm::{Limit, UserLimits};
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    onboarded(&h).await;
    // carol also works for another tenant, with a pending job there
    let limits = UserLimits { max_jobs: Some(Limit::At(5)), ..Default::default() };
    let other = h.carol_in_another_tenant(&limits).await;
    let elsewhere = h.sbatch_in(&other, &["--begin=now+3600"]).unwrap();

    h.set_member(false, true);
    let id = h.engine.enqueue(&[offboard_job(&h)]).await.unwrap()[0].id;
    let done = eventually(T, "the offboarding to end", || async {
        let j = h.engine.job(id).await.unwrap();
        matches!(j.state.as_str(), "succeeded" | "failed").then_some(j)
    })
    .await;
    assert_eq!(done.state, JobState::Succeeded, "{:?} at {}: {}", done.last_error, done.step, done.outputs);
    assert_eq!(done.outputs["block"]["left_alone"], json!([other]), "{}", done.outputs);
    assert_eq!(done.outputs["disable_login"]["authentik"], "deactivated");
    // gone from this tenant; in the other one she is unblocked, her pending job is still there
    assert!(carol_rows(&h, &h.assocs().await).is_empty());
    let carol = onramp::domain::names::Username::parse(UNIX_USER).unwrap();
    let state = h.backends.slurm.user(&carol).await.unwrap().expect("carol is still a Slurm user");
    let a = state.assocs.iter().find(|a| a.account == other).expect("the other tenant's association");
    assert!(!a.is_blocked() && a.max_submit_jobs != onramp::backends::slurm::Limit::At(0), "{a:?}");
    assert!(h.squeue().iter().any(|(i, _)| *i == elsewhere), "{:?}", h.squeue());
    assert!(h.sbatch_in(&other, &["--test-only"]).is_ok());
}

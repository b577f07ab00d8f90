//! QOS declared in the registry: created and converged in the real slurmdbd (one QOS per test,
//! deleted afterwards), and usable by an association once onboarding made it.

use std::time::Duration;

use onramp::engine::Actor;
use onramp::flows::tenant::{TENANT_ONBOARD, job};

use super::*;
use crate::common::wait_state;
use crate::flows_support::{CAROL, Harness, UNIX_USER, short};

/// Deletes the QOS (after the accounts that name it).
struct DropQos(String);

impl Drop for DropQos {
    fn drop(&mut self) {
        let _ = std::process::Command::new("sacctmgr")
            .args(["-i", "delete", "qos", "where", &format!("name={}", self.0)])
            .output();
    }
}

#[tokio::test]
async fn a_declared_qos_is_created_converged_and_then_an_association_can_name_it() {
    let s = slurm();
    let (t, a, q, unix) = (uniq("t"), uniq("a"), uniq("q"), "onramp-alice");
    let _q = DropQos(q.clone());
    let _c = Cleanup { accounts: vec![a.clone(), t.clone()], users: vec![] };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let mut limits = user_limits();
    limits.qos = Some(vec![qos("normal"), qos(&q)]);
    let spec = UserSpec { user: user(unix), account: acct(&a), default_account: false, limits };
    // before: Slurm refuses the association (the failure onboarding's `qos` step prevents)
    let e = s.ensure_user(&spec).await.unwrap_err();
    assert!(matches!(e, SlurmError::UnknownQos { .. }), "{e:?}");
    assert!(s.qos(&[qos(&q)]).await.unwrap().is_empty());

    let mut want = QosSpec {
        name: qos(&q),
        priority: Some(100),
        max_tres_per_user: Some(Tres::gpus(8)),
        max_jobs_per_user: Some(Limit::At(10)),
    };
    assert_eq!(s.ensure_qos(std::slice::from_ref(&want)).await.unwrap().created, vec![q.clone()]);
    assert!(s.ensure_qos(std::slice::from_ref(&want)).await.unwrap().is_noop());
    let got = s.qos(&[qos(&q), qos("normal")]).await.unwrap();
    let mine = got.iter().find(|x| x.name == q).unwrap();
    assert_eq!(
        (mine.priority, mine.max_tres_per_user.get("gres/gpu"), mine.max_jobs_per_user),
        (100, Some(8), Limit::At(10))
    );
    assert!(got.iter().any(|x| x.name == "normal"), "{got:?}");

    // changed in the registry: converged, extra TRES cleared, then nothing to do
    want.priority = Some(5);
    want.max_tres_per_user = Some(Tres::gpus(2));
    want.max_jobs_per_user = Some(Limit::Unlimited);
    let e = s.ensure_qos(std::slice::from_ref(&want)).await.unwrap();
    assert_eq!(e.changed, [format!("{q}: Priority"), format!("{q}: MaxTRESPerUser"), format!("{q}: MaxJobsPerUser")]);
    assert!(s.ensure_qos(std::slice::from_ref(&want)).await.unwrap().is_noop());
    let got = s.qos(&[qos(&q)]).await.unwrap();
    assert_eq!(
        (got[0].priority, got[0].max_tres_per_user.to_string(), got[0].max_jobs_per_user),
        (5, "gres/gpu=2".into(), Limit::Unlimited)
    );

    // after: the association names it, and the user's job may ask for it
    assert_eq!(s.ensure_user(&spec).await.unwrap().created, vec![unix.to_string()]);
    let x = assoc(&s.associations(&[acct(&a)]).await.unwrap(), &a, unix).clone();
    assert!(x.qos.contains(&q), "{x:?}");
    let o = runuser(
        unix,
        &["sbatch", "--test-only", &format!("--account={a}"), &format!("--qos={q}"), "--time=1", "--wrap", "true"],
    );
    assert!(o.status.success(), "{o:?}");
    s.delete_account(&acct(&t)).await.unwrap();
}

#[tokio::test]
async fn tenant_onboarding_creates_the_declared_qos_before_the_members_associations_name_it() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.add_carol(true);
    h.sync_key();
    let s = slurm();
    assert!(s.qos(&[qos(&h.qos)]).await.unwrap().is_empty(), "the harness's QOS is new");

    let id = h.engine.enqueue(&[job(TENANT_ONBOARD, &h.tenant, Actor::cli("ops"))]).await.unwrap()[0].id;
    let j = wait_state(&h.engine, id, "succeeded", Duration::from_secs(60)).await;
    assert_eq!(onramp::flows::tenant::ONBOARD_STEPS[0], "qos");
    assert_eq!(j.outputs["qos"]["created"], serde_json::json!([h.qos]), "{}", j.outputs);
    let got = s.qos(&[qos(&h.qos)]).await.unwrap();
    assert_eq!((got[0].priority, got[0].max_tres_per_user.to_string()), (10, "gres/gpu=2".into()));
    // the member's association (made in the same job, after) names it, and her job may use it
    let rows = h.assocs().await;
    let carol = rows.iter().find(|r| r[0] == h.team && r[1] == UNIX_USER).expect("member added");
    assert!(carol[5].split(',').any(|x| x == h.qos), "{rows:?}");
    h.sbatch(&["--test-only", &format!("--qos={}", h.qos)]).unwrap();
}

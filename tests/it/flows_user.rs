//! User onboarding and offboarding end to end (see flows_support for the set-up).

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use onramp::engine::{Actor, NewJob};
use onramp::reconcile::{USER_OFFBOARD, USER_ONBOARD};
use serde_json::{Value, json};

use crate::common::{eventually, wait_state};
use crate::flows_support::{CAROL, Harness, KEY, PK, UNIX_USER, short};

const T: Duration = Duration::from_secs(90);

fn onboard_job(h: &Harness) -> NewJob {
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
    assert_eq!((rows[0][2].as_str(), rows[0][5].as_str(), rows[0][6].as_str()), ("20", "normal", "parent"), "{rows:?}");
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
    let fp = onramp::sshkey::PublicKey::parse(KEY).unwrap().fingerprint();
    assert!(mails[0].contains(&fp), "{}", mails[0]);

    // Every step is in the history, with what it did.
    let o = &job.outputs;
    assert_eq!(o["key_in_secret"]["fingerprint"], fp.as_str());
    assert_eq!(o["propagation_wait"]["waited_secs"], 0.3);
    assert_eq!(o["slurm_association"]["created"], json!([UNIX_USER]));
    assert_eq!(o["home_directory"]["created"], true);
    assert_eq!(o["key_projected"]["projected"], true);
    assert_eq!((o["smoke_test"]["uid"].as_u64(), o["smoke_test"]["gid"].as_u64()), (Some(5003), Some(5003)));
    assert!(o["smoke_test"]["sbatch"].as_str().unwrap().contains("to start at"), "{o}");
    assert_eq!(o["notify"]["sent"], true);
    let runs = h.engine.step_runs(*id).await.unwrap();
    let steps: Vec<&str> = runs.iter().map(|r| r.step.as_str()).collect();
    for s in onramp::flows::user_onboard::STEPS {
        assert!(steps.contains(&s), "{s} missing in {steps:?}");
    }
    // The Secret was read in the tenant's namespace.
    assert!(
        h.k8s
            .requests()
            .iter()
            .any(|(_, u)| u.contains(&format!("/namespaces/{}/secrets/{}-authorized-keys", h.tenant, h.tenant))),
        "{:?}",
        h.k8s.requests()
    );
}

//! The welcome e-mail goes out once per onboarding, also when the worker dies after the SMTP
//! server took it and before the notify step's result was written.

use std::time::Duration;

use onramp::flows::user_onboard::Step;

use crate::common::{eventually, wait_state};
use crate::flows_support::{CAROL, Harness, short};
use crate::flows_user::onboard_job;

const T: Duration = Duration::from_secs(90);

/// Leaves the job as a worker killed inside `notify` after the send leaves it: running at that
/// step, its lease expired, no result. The worker takes it over and runs the step again.
async fn as_if_killed_in_notify(h: &Harness, id: i64) {
    let index = Step::ALL.iter().position(|s| *s == Step::Notify).unwrap() as i32;
    sqlx::query(
        "update jobs set queue_state = 'pending', step_index = $2, step = 'notify', outputs = outputs - 'notify',
                lease_owner = 'killed-worker', lease_until = now(), run_at = now(), finished_at = null
         where id = $1",
    )
    .bind(id)
    .bind(index)
    .execute(&h._db.pool)
    .await
    .unwrap();
}

async fn notify_runs(h: &Harness, id: i64) -> i64 {
    sqlx::query_scalar("select count(*) from step_runs where job_id = $1 and step = 'notify'")
        .bind(id)
        .fetch_one(&h._db.pool)
        .await
        .unwrap()
}

fn message_ids(h: &Harness) -> Vec<String> {
    let mails = h.mails();
    mails.iter().filter_map(|m| m.lines().find(|l| l.starts_with("Message-ID: ")).map(str::to_string)).collect()
}

#[tokio::test]
async fn a_notify_step_taken_over_after_its_worker_died_does_not_send_again() {
    let _one = CAROL.lock().await;
    let h = Harness::start(short()).await;
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();
    let (id, _) = h.run_to_success(onboard_job(&h)).await;
    let first =
        eventually(Duration::from_secs(10), "the e-mail", || async { Some(message_ids(&h)).filter(|m| !m.is_empty()) })
            .await;
    let created: i64 =
        sqlx::query_scalar("select floor(extract(epoch from created_at))::bigint from jobs where id = $1")
            .bind(id)
            .fetch_one(&h._db.pool)
            .await
            .unwrap();
    assert_eq!(first, vec![format!("Message-ID: <onramp.job{id}-{created}.notify.onramp-carol@cluster.example>")]);

    // Taken over: the step runs again, finds the send recorded and sends nothing.
    as_if_killed_in_notify(&h, id).await;
    let job = wait_state(&h.engine, id, "succeeded", T).await;
    assert_eq!(notify_runs(&h, id).await, 2);
    assert_eq!(job.outputs["notify"]["sent"], true, "{}", job.outputs);
    // The SMTP server writes a message before it answers, and the step answered: nothing is in flight.
    assert_eq!(message_ids(&h), first);

    // The control: without the record the step sends again, the same message (same Message-ID).
    sqlx::query("delete from step_marks where job_id = $1").bind(id).execute(&h._db.pool).await.unwrap();
    as_if_killed_in_notify(&h, id).await;
    wait_state(&h.engine, id, "succeeded", T).await;
    assert_eq!(notify_runs(&h, id).await, 3);
    assert_eq!(message_ids(&h), [first.clone(), first].concat());
}

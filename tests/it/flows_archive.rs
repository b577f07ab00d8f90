//! Archives that hold data (see flows_support for the set-up): an offboarding exports the
//! accounting records of real finished jobs before anything is deleted, the delete step re-reads
//! the export and refuses when it is missing, changed or empty while sacct shows records, and the
//! user record goes with the user's last association only.

use std::sync::Arc;
use std::time::Duration;

use onramp::engine::simulate::simulate;
use onramp::engine::{Actor, Flow, JobState, NewJob, StepCtx, StepFuture, Transition};
use onramp::flows::Backends;
use onramp::flows::user_offboard::{STEPS, USER_OFFBOARD, UserOffboard};
use onramp::flows::user_onboard::USER_ONBOARD;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};

use crate::common::eventually;
use crate::flows_support::{CAROL, Harness, PK, UNIX_USER, short};

const T: Duration = Duration::from_secs(90);

fn job(h: &Harness, kind: &str) -> NewJob {
    let input = json!({ "tenant": h.tenant, "account": h.team, "username": UNIX_USER, "pk": PK });
    NewJob::new(kind, &format!("{}/{UNIX_USER}", h.tenant), input, Actor::cli("test"))
}

/// Carol onboarded, with one job of hers in the team account that ran and ended, as sacct shows
/// it. Returns the job's id.
async fn onboarded_with_a_finished_job(h: &Harness) -> String {
    h.ensure_tenant_accounts().await;
    h.add_carol(true);
    h.sync_key();
    h.run_to_success(job(h, USER_ONBOARD)).await;
    let o = std::process::Command::new("runuser")
        .args(["-u", UNIX_USER, "--", "sbatch", "--parsable", "-o", "/dev/null", "--time=1"])
        .arg(format!("--account={}", h.team))
        .args(["--wrap", "true"])
        .output()
        .unwrap();
    assert!(o.status.success(), "sbatch: {}", String::from_utf8_lossy(&o.stderr));
    let id = String::from_utf8_lossy(&o.stdout).trim().to_string();
    // over a time window, as the export asks: `sacct -j` shows the job a moment sooner
    eventually(Duration::from_secs(60), "sacct to show the job ended", || async {
        let o = std::process::Command::new("sacct")
            .args(["-n", "-P", "-X", "--allusers", "-S", "1970-01-02", "-E", "now+1days", "--format=JobID,State"])
            .arg(format!("--user={UNIX_USER}"))
            .arg(format!("--accounts={}", h.team))
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).lines().any(|l| l == format!("{id}|COMPLETED")).then_some(())
    })
    .await;
    id
}

/// `sacctmgr show user` of carol (any cluster, any association).
fn slurm_user_rows() -> String {
    let o = std::process::Command::new("sacctmgr")
        .args(["-n", "-P", "show", "user", UNIX_USER, "withassoc", "format=user,account"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Carol's association with the team, as `sacctmgr show assoc` lists it.
async fn has_team_association(h: &Harness) -> bool {
    h.assocs().await.iter().any(|r| r[0] == h.team && r[1] == UNIX_USER)
}

fn sha256_of(path: &str) -> String {
    format!("{:x}", Sha256::digest(std::fs::read(path).unwrap()))
}

async fn offboard(h: &Harness) -> Value {
    h.set_member(false, true);
    let id = h.engine.enqueue(&[job(h, USER_OFFBOARD)]).await.unwrap()[0].id;
    let done = eventually(T, "the offboarding to end", || async {
        let j = h.engine.job(id).await.unwrap();
        matches!(j.state.as_str(), "succeeded" | "failed").then_some(j)
    })
    .await;
    assert_eq!(done.state, JobState::Succeeded, "{:?} at {}: {}", done.last_error, done.step, done.outputs);
    done.outputs
}

#[tokio::test]
async fn the_archive_holds_the_users_records_and_the_last_association_takes_the_user_record() {
    let _one = CAROL.lock().await;
    let _node = crate::slurm::NODE.lock().await;
    let h = Harness::start(short()).await;
    let ran = onboarded_with_a_finished_job(&h).await;
    let o = offboard(&h).await;

    // The export: in the archive directory, named for the tenant, account, user and day.
    let x = &o["archive"]["export"];
    let path = x["path"].as_str().unwrap_or_else(|| panic!("{o}"));
    let d = time::OffsetDateTime::now_utc().date();
    let day = format!("{:04}{:02}{:02}", d.year(), u8::from(d.month()), d.day());
    let want = format!("{}/archive/offboard-{}-{}-{UNIX_USER}-{day}.sacct", h.root.path().display(), h.tenant, h.team);
    assert_eq!(path, want);
    // It holds the job (and its steps) as sacct has them; its checksum and rows are recorded.
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("JobID|User|Account|"), "{text}");
    assert!(lines.iter().any(|l| l.starts_with(&format!("{ran}|{UNIX_USER}|{}|", h.team))), "{text}");
    assert!(lines.iter().any(|l| l.contains("|COMPLETED|")), "{text}");
    let rows = x["rows"].as_u64().unwrap();
    assert!(rows >= 1 && rows == lines.len() as u64 - 1, "{x} vs {text}");
    assert_eq!(x["records_at_export"].as_u64(), Some(rows), "{x}");
    assert_eq!(x["sha256"].as_str().unwrap(), sha256_of(path));
    // Only this user's records in this account: every job line is carol's in the team.
    for l in lines[1..].iter().filter(|l| !l.split('|').next().unwrap().contains('.')) {
        assert!(l.contains(&format!("|{UNIX_USER}|{}|", h.team)), "{l}");
    }

    // The delete re-read it, then took the association and, with it, the user record.
    assert_eq!(o["delete"]["archive"], json!({ "path": path, "sha256": x["sha256"], "rows": rows }), "{o}");
    assert_eq!(o["delete"]["user_record"], "gone", "{o}");
    assert!(!has_team_association(&h).await);
    assert_eq!(slurm_user_rows(), "", "no user record is left");
    // The export was a change on the Slurm host, its read-backs were not.
    let effects = h.log.since(0);
    let export = effects.iter().find(|e| e.call.starts_with("sh -c ")).expect("the export is recorded");
    assert!(export.write && export.system == "slurm" && export.call.contains(path), "{export:?}");
    assert!(effects.iter().any(|e| e.call.starts_with("sha256sum -- ") && !e.write));
}

#[tokio::test]
async fn a_user_with_another_tenants_association_keeps_the_user_record_and_that_association() {
    let _one = CAROL.lock().await;
    let _node = crate::slurm::NODE.lock().await;
    let h = Harness::start(short()).await;
    onboarded_with_a_finished_job(&h).await;
    let other = h.carol_in_another_tenant(&Default::default()).await;

    let o = offboard(&h).await;
    assert!(o["archive"]["export"]["rows"].as_u64().unwrap() >= 1, "{o}");
    assert_eq!(o["delete"]["deleted"], true, "{o}");
    assert_eq!(o["delete"]["user_record"], "kept", "{o}");
    assert_eq!(o["delete"]["user_record_kept_by"], json!([format!("{other} on production")]), "{o}");
    assert!(!has_team_association(&h).await);
    assert_eq!(slurm_user_rows(), format!("{UNIX_USER}|{other}"), "the record and the other association stay");
}

/// A flow's steps but its last (the delete), so a test can act between the archive and the delete.
struct AllButLast<F>(F);

impl<F: Flow> Flow for AllButLast<F> {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn steps(&self) -> &'static [&'static str] {
        let all = self.0.steps();
        &all[..all.len() - 1]
    }
    fn run<'a>(&'a self, step: usize, ctx: &'a StepCtx) -> StepFuture<'a> {
        self.0.run(step, ctx)
    }
}

/// Runs the real `delete` step once, after the given earlier steps' outputs.
async fn delete_step(b: &Arc<Backends>, input: &Value, outputs: &Map<String, Value>) -> Transition {
    let ctx =
        StepCtx::detached(USER_OFFBOARD, "archive-test", input.clone(), outputs.clone(), "delete", STEPS.len() - 1);
    UserOffboard(b.clone()).run(STEPS.len() - 1, &ctx).await
}

fn refusal(t: Transition) -> String {
    match t {
        Transition::Fail(why) => why,
        other => panic!("the delete was not refused: {other:?}"),
    }
}

#[tokio::test]
async fn a_changed_missing_or_empty_archive_stops_the_delete() {
    let _one = CAROL.lock().await;
    let _node = crate::slurm::NODE.lock().await;
    let h = Harness::start(short()).await;
    onboarded_with_a_finished_job(&h).await;
    h.set_member(false, true);
    let input = job(&h, USER_OFFBOARD).input;
    let flow = AllButLast(UserOffboard(h.backends.clone()));
    let outputs = simulate(&flow, "archive-test", input.clone(), |_, _, _| {}).await.unwrap();
    let path = outputs["archive"]["export"]["path"].as_str().unwrap().to_string();
    let original = std::fs::read(&path).unwrap();
    assert!(outputs["archive"]["export"]["rows"].as_u64().unwrap() >= 1, "{outputs:?}");

    // Changed: a row added.
    let mut forged = original.clone();
    forged.extend_from_slice(b"99999|someone|elsewhere|main|normal|COMPLETED|0:0|||||0||\n");
    std::fs::write(&path, &forged).unwrap();
    let why = refusal(delete_step(&h.backends, &input, &outputs).await);
    assert!(why.contains(&format!("the archive {path} changed after the archive step")), "{why}");
    assert!(has_team_association(&h).await, "nothing was deleted");
    // Truncated: the same, with no rows left.
    std::fs::write(&path, b"").unwrap();
    let why = refusal(delete_step(&h.backends, &input, &outputs).await);
    assert!(why.contains("changed after the archive step") && why.contains("and 0 rows now"), "{why}");
    // Missing.
    std::fs::remove_file(&path).unwrap();
    let why = refusal(delete_step(&h.backends, &input, &outputs).await);
    assert!(why.contains(&format!("the archive {path} is missing")), "{why}");
    assert!(has_team_association(&h).await, "nothing was deleted");

    // An export that came out empty (the header only, as recorded) while sacct shows her records.
    let header = original.split(|b| *b == b'\n').next().unwrap();
    let empty = format!("{path}.empty");
    std::fs::write(&empty, [header, b"\n"].concat()).unwrap();
    let mut hollow = outputs.clone();
    hollow["archive"]["export"] = json!({ "path": empty, "sha256": sha256_of(&empty), "rows": 0,
                                          "records_at_export": 0 });
    let why = refusal(delete_step(&h.backends, &input, &hollow).await);
    assert!(why.contains(&format!("the archive {empty} holds no records while sacct shows")), "{why}");
    assert!(has_team_association(&h).await, "nothing was deleted");

    // The export as written: the delete goes ahead.
    std::fs::write(&path, &original).unwrap();
    match delete_step(&h.backends, &input, &outputs).await {
        Transition::Done(v) => {
            assert_eq!((v["deleted"].as_bool(), v["user_record"].as_str()), (Some(true), Some("gone")))
        }
        other => panic!("{other:?}"),
    }
    assert!(!has_team_association(&h).await);
}

#[tokio::test]
async fn a_tenants_archive_holds_its_records_and_a_changed_one_stops_the_accounts_delete() {
    use onramp::flows::tenant::{OFFBOARD_STEPS, TENANT_OFFBOARD, TenantOffboard};
    let _one = CAROL.lock().await;
    let _node = crate::slurm::NODE.lock().await;
    let h = Harness::start(short()).await;
    let ran = onboarded_with_a_finished_job(&h).await;
    let input = json!({ "tenant": h.tenant });
    let flow = AllButLast(TenantOffboard(h.backends.clone()));
    let outputs = simulate(&flow, "archive-test", input.clone(), |_, _, _| {}).await.unwrap();

    // The tenant's export: every account of the tenant, every user; named as its final snapshot.
    let x = &outputs["archive"]["export"];
    let path = x["path"].as_str().unwrap().to_string();
    let name = path.rsplit('/').next().unwrap();
    assert!(name.starts_with(&format!("offboard-final-{}-", h.tenant)) && name.ends_with(".sacct"), "{path}");
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().any(|l| l.starts_with(&format!("{ran}|{UNIX_USER}|{}|", h.team))), "{text}");
    assert_eq!(x["rows"].as_u64(), Some(text.lines().count() as u64 - 1), "{x}");
    assert_eq!(x["sha256"].as_str().unwrap(), sha256_of(&path));

    let last = OFFBOARD_STEPS.len() - 1;
    let ctx = |outputs: &Map<String, Value>| {
        StepCtx::detached(TENANT_OFFBOARD, "archive-test", input.clone(), outputs.clone(), OFFBOARD_STEPS[last], last)
    };
    let tenant = TenantOffboard(h.backends.clone());
    // a line less: refused, the accounts stay
    let kept: Vec<&str> = text.lines().take(text.lines().count() - 1).collect();
    std::fs::write(&path, format!("{}\n", kept.join("\n"))).unwrap();
    let why = refusal(tenant.run(last, &ctx(&outputs)).await);
    assert!(why.contains(&format!("the archive {path} changed after the archive step")), "{why}");
    assert!(h.assocs().await.iter().any(|r| r[0] == h.team), "nothing was deleted");
    // as written: the accounts go
    std::fs::write(&path, &text).unwrap();
    match tenant.run(last, &ctx(&outputs)).await {
        Transition::Done(v) => assert_eq!(v["archive"]["sha256"], x["sha256"], "{v}"),
        other => panic!("{other:?}"),
    }
    assert!(h.assocs().await.is_empty(), "{:?}", h.assocs().await);
}

/// The export's time window reaches back before today: sacct takes a start of time 0
/// (`1970-01-01`) for "not given" and starts the window at today's midnight instead, which left
/// every earlier job out of an export made after midnight.
#[tokio::test]
async fn the_exports_window_reaches_back_before_today() {
    use onramp::backends::slurm::JobScope;
    use onramp::backends::slurm::export::count;
    use onramp::domain::names::{ClusterName, SlurmAccount};
    let account = SlurmAccount::parse("window-check").unwrap();
    let cmd = count(&ClusterName::parse("production").unwrap(), &JobScope::Account(account.clone()), &[account]);
    let argv = cmd.argv();
    // -v: sacct says which window it selects from
    let o = std::process::Command::new(&argv[0]).args(&argv[1..]).arg("-v").output().unwrap();
    let said = String::from_utf8_lossy(&o.stderr);
    let window = said.lines().find(|l| l.contains("time window from")).unwrap_or_else(|| panic!("sacct -v: {said}"));
    assert!(window.contains(" 1970 to "), "{window}");
}

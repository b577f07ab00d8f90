//! The Slurm backend against the real test cluster (`scripts/slurm-test-cluster.sh start`):
//! every operation twice, limits changed in between, state read back; jobs of real unix users.
//! Names are unique per test; each test deletes what it made (also when it fails).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use onramp::exec::{Command, Local, RunFuture, Transport};
use onramp::names::{ClusterName, QosName, SlurmAccount, Username};
use onramp::slurm::*;

use crate::common::eventually;

/// Tests that need the node's two CPUs take turns.
static NODE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
static LOCAL: Local = Local;

/// Panics with what to do when the cluster is not there (checked once per test binary).
fn cluster_up() {
    static UP: OnceLock<Result<(), String>> = OnceLock::new();
    let up = UP.get_or_init(|| {
        let run = |p: &str, a: &[&str]| {
            std::process::Command::new(p)
                .args(a)
                .output()
                .map_err(|e| format!("{p}: {e}"))
        };
        let o = run("scontrol", &["ping"])?;
        if !String::from_utf8_lossy(&o.stdout).contains("is UP") {
            return Err(format!(
                "scontrol ping: {}",
                String::from_utf8_lossy(&o.stdout).trim()
            ));
        }
        let o = run(
            "sacctmgr",
            &["-n", "-P", "show", "cluster", "format=cluster"],
        )?;
        if !String::from_utf8_lossy(&o.stdout)
            .lines()
            .any(|l| l == "production")
        {
            return Err(format!(
                "sacctmgr show cluster: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Ok(())
    });
    if let Err(e) = up {
        panic!(
            "the Slurm test cluster is not running ({e}): run `scripts/slurm-test-cluster.sh start`"
        );
    }
}

fn cluster() -> ClusterName {
    ClusterName::parse("production").unwrap()
}

fn slurm() -> SlurmCli {
    cluster_up();
    SlurmCli::new(Arc::new(Local), cluster())
}

/// A name no other test (or test run) uses.
fn uniq(tag: &str) -> String {
    format!("ot{:06x}-{tag}", fastrand::u32(..0xff_ffff))
}

fn acct(s: &str) -> SlurmAccount {
    SlurmAccount::parse(s).unwrap()
}

fn user(s: &str) -> Username {
    Username::parse(s).unwrap()
}

fn qos(s: &str) -> QosName {
    QosName::parse(s).unwrap()
}

fn text(s: &str) -> SlurmText {
    SlurmText::parse(s).unwrap()
}

/// Deletes (best effort, synchronously) what a test made: jobs in its accounts, its users, its accounts.
struct Cleanup {
    accounts: Vec<String>,
    users: Vec<String>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let run = |args: &[&str]| {
            let _ = std::process::Command::new(args[0])
                .args(&args[1..])
                .output();
        };
        for a in &self.accounts {
            run(&["scancel", &format!("--account={a}")]); // one account per call: a list cancels nothing
        }
        if !self.users.is_empty() {
            run(&[
                "sacctmgr",
                "-i",
                "delete",
                "user",
                "where",
                &format!("name={}", self.users.join(",")),
            ]);
        }
        if !self.accounts.is_empty() {
            run(&[
                "sacctmgr",
                "-i",
                "delete",
                "account",
                "where",
                &format!("name={}", self.accounts.join(",")),
            ]);
        }
    }
}

fn tenant(name: &str, teams: &[&str]) -> TenantSpec {
    let t = acct(name);
    TenantSpec {
        account: AccountSpec {
            name: t.clone(),
            parent: None,
            description: text("Tenant Foo"),
            organization: text(name),
            limits: AccountLimits {
                fairshare: Some(Fairshare::Shares(300)),
                grp_tres: Some(Tres::gpus(4).with("cpu", 8).unwrap()),
                grp_jobs: Some(Limit::At(200)),
            },
        },
        teams: teams
            .iter()
            .map(|n| AccountSpec {
                name: acct(n),
                parent: Some(t.clone()),
                description: text("Tenant Foo ML Team"),
                organization: text(name),
                limits: AccountLimits {
                    fairshare: Some(Fairshare::Shares(200)),
                    ..Default::default()
                },
            })
            .collect(),
    }
}

fn user_limits() -> UserLimits {
    UserLimits {
        fairshare: Some(Fairshare::Parent),
        default_qos: Some(qos("normal")),
        qos: Some(vec![qos("normal")]),
        max_jobs: Some(Limit::At(20)),
        grp_jobs: None,
        grp_tres_mins: Some(Tres::gpus(10000)),
    }
}

fn assoc<'a>(all: &'a [Association], account: &str, user: &str) -> &'a Association {
    all.iter()
        .find(|a| a.account == account && a.user == user)
        .unwrap_or_else(|| panic!("no association {account}/{user} in {all:#?}"))
}

#[tokio::test]
async fn tenant_accounts_are_ensured_idempotently_converged_blocked_and_deleted_with_children() {
    let s = slurm();
    let (t, a, b) = (uniq("t"), uniq("ml"), uniq("data"));
    let _c = Cleanup {
        accounts: vec![a.clone(), b.clone(), t.clone()],
        users: vec![],
    };
    let mut spec = tenant(&t, &[&a, &b]);

    let first = s.ensure_tenant(&spec).await.unwrap();
    assert_eq!(first.created, [t.clone(), a.clone(), b.clone()]);
    assert!(
        s.ensure_tenant(&spec).await.unwrap().is_noop(),
        "second run changes nothing"
    );
    let names = [acct(&t), acct(&a), acct(&b)];
    let all = s.associations(&names).await.unwrap();
    let ta = assoc(&all, &t, "");
    assert_eq!(
        (ta.parent.as_str(), ta.fairshare, ta.grp_jobs),
        ("root", Fairshare::Shares(300), Limit::At(200))
    );
    assert_eq!(
        (ta.grp_tres.get("gres/gpu"), ta.grp_tres.get("cpu")),
        (Some(4), Some(8))
    );
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
        [
            format!("{t}: Fairshare"),
            format!("{t}: GrpTRES"),
            format!("{t}: GrpJobs"),
            format!("{b}: Description")
        ]
    );
    assert!(s.ensure_tenant(&spec).await.unwrap().is_noop());
    let all = s.associations(&names).await.unwrap();
    let ta = assoc(&all, &t, "");
    assert_eq!(
        (ta.fairshare, ta.grp_jobs, ta.grp_tres.to_string().as_str()),
        (Fairshare::Shares(100), Limit::Unlimited, "gres/gpu=8")
    );

    // Block and unblock the tenant, twice each.
    assert_eq!(
        s.block_account(&acct(&t)).await.unwrap().changed,
        ["GrpJobs", "GrpSubmitJobs"]
    );
    assert!(s.block_account(&acct(&t)).await.unwrap().is_noop());
    assert!(assoc(&s.associations(&names).await.unwrap(), &t, "").is_blocked());
    assert!(
        !s.unblock_account(&acct(&t), Limit::At(50))
            .await
            .unwrap()
            .is_noop()
    );
    assert!(
        s.unblock_account(&acct(&t), Limit::At(50))
            .await
            .unwrap()
            .is_noop()
    );
    assert_eq!(
        assoc(&s.associations(&names).await.unwrap(), &t, "").grp_jobs,
        Limit::At(50)
    );

    // Deleting the tenant deletes the team accounts too (rows and all), once.
    let gone = s.delete_account(&acct(&t)).await.unwrap();
    assert!(
        matches!(&gone, Deleted::Deleted { removed } if removed.len() == 3),
        "{gone:?}"
    );
    assert_eq!(
        s.delete_account(&acct(&t)).await.unwrap(),
        Deleted::AlreadyGone
    );
    let rows = std::process::Command::new("sacctmgr")
        .args([
            "-n",
            "-P",
            "show",
            "account",
            "where",
            &format!("name={t},{a},{b}"),
            "format=account",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&rows.stdout),
        "",
        "no account rows left behind"
    );
}

#[tokio::test]
async fn account_mistakes_are_permanent_errors() {
    let s = slurm();
    let (t, x) = (uniq("t"), uniq("x"));
    let _c = Cleanup {
        accounts: vec![x.clone(), t.clone()],
        users: vec![],
    };
    let mut spec = tenant(&t, &[]).account;
    spec.name = acct(&x);
    spec.parent = Some(acct(&uniq("nope")));
    let e = s.ensure_account(&spec).await.unwrap_err();
    assert!(
        matches!(e, SlurmError::MissingParent(_)) && !e.is_retryable(),
        "{e:?}"
    );

    spec.parent = None;
    spec.limits.grp_tres = Some(Tres::new().with("gres/foo", 3).unwrap());
    let e = s.ensure_account(&spec).await.unwrap_err();
    assert!(
        matches!(e, SlurmError::UnknownTres { .. }) && !e.is_retryable(),
        "{e:?}"
    );

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
    assert!(matches!(
        s.ensure_tenant(&other).await.unwrap_err(),
        SlurmError::Invalid(_)
    ));
}

#[tokio::test]
async fn user_associations_converge_and_the_default_account_moves_before_a_delete() {
    let s = slurm();
    let (t, a, b, u) = (uniq("t"), uniq("a"), uniq("b"), uniq("u"));
    let _c = Cleanup {
        accounts: vec![a.clone(), b.clone(), t.clone()],
        users: vec![u.clone()],
    };
    s.ensure_tenant(&tenant(&t, &[&a, &b])).await.unwrap();
    let mut spec = UserSpec {
        user: user(&u),
        account: acct(&a),
        default_account: true,
        limits: user_limits(),
    };

    assert_eq!(s.ensure_user(&spec).await.unwrap().created, vec![u.clone()]);
    assert!(s.ensure_user(&spec).await.unwrap().is_noop());
    let st = s.user(&user(&u)).await.unwrap().unwrap();
    assert_eq!(st.default_account, a);
    let x = assoc(&st.assocs, &a, &u);
    assert_eq!(
        (x.fairshare, x.max_jobs, x.default_qos.as_str()),
        (Fairshare::Parent, Limit::At(20), "normal")
    );
    assert_eq!(x.grp_tres_mins.get("gres/gpu"), Some(10000));

    spec.limits.max_jobs = Some(Limit::At(5));
    spec.limits.grp_tres_mins = Some(Tres::gpus(500));
    spec.limits.grp_jobs = Some(Limit::At(7));
    let ch = s.ensure_user(&spec).await.unwrap();
    assert_eq!(
        ch.changed,
        [
            format!("{u}: MaxJobs"),
            format!("{u}: GrpJobs"),
            format!("{u}: GrpTRESMins")
        ]
    );
    assert!(s.ensure_user(&spec).await.unwrap().is_noop());
    let x = s
        .user(&user(&u))
        .await
        .unwrap()
        .unwrap()
        .assocs
        .into_iter()
        .find(|x| x.account == a)
        .unwrap();
    assert_eq!(
        (x.max_jobs, x.grp_jobs, x.grp_tres_mins.get("gres/gpu")),
        (Limit::At(5), Limit::At(7), Some(500))
    );

    // A second association that is not the default; then the default one goes: the default moves first.
    let second = UserSpec {
        account: acct(&b),
        default_account: false,
        ..spec.clone()
    };
    assert_eq!(s.ensure_user(&second).await.unwrap().created, vec![u.clone()]);
    assert_eq!(s.user(&user(&u)).await.unwrap().unwrap().default_account, a);
    assert!(matches!(
        s.delete_user_association(&user(&u), &acct(&a))
            .await
            .unwrap(),
        Deleted::Deleted { .. }
    ));
    assert_eq!(
        s.delete_user_association(&user(&u), &acct(&a))
            .await
            .unwrap(),
        Deleted::AlreadyGone
    );
    let st = s.user(&user(&u)).await.unwrap().unwrap();
    assert_eq!(
        (st.default_account.as_str(), st.assocs.len()),
        (b.as_str(), 1)
    );

    // Mistakes are permanent.
    let bad = UserSpec {
        account: acct(&uniq("nope")),
        ..spec.clone()
    };
    assert!(matches!(
        s.ensure_user(&bad).await.unwrap_err(),
        SlurmError::MissingAccount(_)
    ));
    let mut bad = second.clone();
    bad.limits.qos = Some(vec![qos("nosuchqos")]);
    bad.limits.default_qos = None;
    let e = s.ensure_user(&bad).await.unwrap_err();
    assert!(
        matches!(e, SlurmError::UnknownQos { .. }) && !e.is_retryable(),
        "{e:?}"
    );

    assert!(matches!(
        s.delete_user(&user(&u)).await.unwrap(),
        Deleted::Deleted { .. }
    ));
    assert_eq!(
        s.delete_user(&user(&u)).await.unwrap(),
        Deleted::AlreadyGone
    );
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
        seen.iter()
            .filter(|c| words.iter().all(|w| c.argv().iter().any(|a| a == w)))
            .count()
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
    let s = SlurmCli::new(counting.clone(), cluster());
    let (t, a) = (uniq("t"), uniq("a"));
    let users: Vec<String> = (0..30).map(|i| uniq(&format!("b{i}"))).collect();
    let singles: Vec<String> = (0..3).map(|i| uniq(&format!("s{i}"))).collect();
    let _c = Cleanup {
        accounts: vec![a.clone(), t.clone()],
        users: users.iter().chain(&singles).cloned().collect(),
    };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let names: Vec<Username> = users.iter().map(|u| user(u)).collect();

    // A few exist already, with other limits: they are converged, the rest added, in one call each.
    let early = UserLimits {
        max_jobs: Some(Limit::At(3)),
        ..Default::default()
    };
    s.add_users(&acct(&a), &names[..2], true, &early)
        .await
        .unwrap();
    let before = counting.seen.lock().unwrap().len();
    let t0 = Instant::now();
    let done = s
        .add_users(&acct(&a), &names, true, &user_limits())
        .await
        .unwrap();
    let batched = t0.elapsed();
    assert_eq!(done.created.len(), 28);
    assert_eq!(done.changed.len(), 2 * 4, "{:?}", done.changed); // Fairshare, QOS, DefaultQOS, MaxJobs, GrpTRESMins minus QOS (normal by default)
    let cmds = counting.seen.lock().unwrap()[before..].to_vec();
    assert_eq!(cmds.len(), 4, "read, add, modify, read back: {cmds:#?}");
    assert!(cmds[1].argv()[4].split(',').count() == 28);

    let again = Instant::now();
    assert!(
        s.add_users(&acct(&a), &names, true, &user_limits())
            .await
            .unwrap()
            .is_noop()
    );
    let noop = again.elapsed();
    let all = s.associations(&[acct(&a)]).await.unwrap();
    assert_eq!(
        all.iter()
            .filter(|x| !x.user.is_empty() && x.max_jobs == Limit::At(20))
            .count(),
        30
    );

    // The same work one user at a time, for the figures.
    let t1 = Instant::now();
    for u in &singles {
        let spec = UserSpec {
            user: user(u),
            account: acct(&a),
            default_account: true,
            limits: user_limits(),
        };
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

fn runuser(unix: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new("runuser")
        .args(["-u", unix, "--"])
        .args(args)
        .output()
        .unwrap()
}

#[tokio::test]
async fn a_real_user_can_submit_until_blocked_and_again_after_unblock() {
    let s = slurm();
    let (t, a, unix) = (uniq("t"), uniq("a"), "onramp-alice");
    let _c = Cleanup {
        accounts: vec![a.clone(), t.clone()],
        users: vec![],
    };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let spec = UserSpec {
        user: user(unix),
        account: acct(&a),
        default_account: false,
        limits: user_limits(),
    };
    s.ensure_user(&spec).await.unwrap();
    let _u = Cleanup {
        accounts: vec![],
        users: vec![],
    };
    let test_only = || {
        runuser(
            unix,
            &[
                "sbatch",
                "--test-only",
                &format!("--account={a}"),
                "--time=1",
                "--wrap",
                "true",
            ],
        )
    };
    let o = test_only();
    assert!(
        o.status.success() && String::from_utf8_lossy(&o.stderr).contains("to start at"),
        "{o:?}"
    );

    assert!(!s.block_user(&user(unix)).await.unwrap().is_noop());
    assert!(s.block_user(&user(unix)).await.unwrap().is_noop());
    assert!(assoc(&s.associations(&[acct(&a)]).await.unwrap(), &a, unix).is_blocked());
    let o = runuser(
        unix,
        &[
            "sbatch",
            &format!("--account={a}"),
            "--time=1",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    if o.status.success() {
        // Accepted: it must pend on the association's job limits.
        let jobs = s.jobs(&JobScope::Account(acct(&a))).await.unwrap();
        assert!(
            jobs.iter()
                .all(|j| j.reason.starts_with("AssocGrpJobsLimit")
                    || j.reason.starts_with("AssocMaxJobsLimit")),
            "{jobs:?}"
        );
    } else {
        assert!(err.contains("AssocMaxSubmitJobLimit"), "{err}");
    }

    let limits = user_limits();
    assert!(
        !s.unblock_user(&user(unix), &limits)
            .await
            .unwrap()
            .is_noop()
    );
    assert!(
        s.unblock_user(&user(unix), &limits)
            .await
            .unwrap()
            .is_noop()
    );
    let x = assoc(&s.associations(&[acct(&a)]).await.unwrap(), &a, unix).clone();
    assert_eq!(
        (x.max_jobs, x.grp_jobs, x.max_submit_jobs),
        (Limit::At(20), Limit::Unlimited, Limit::Unlimited)
    );
    assert!(test_only().status.success());

    // The tenant block caps every team below it.
    s.block_account(&acct(&t)).await.unwrap();
    let o = runuser(
        unix,
        &[
            "sbatch",
            &format!("--account={a}"),
            "--time=1",
            "-o",
            "/dev/null",
            "--wrap",
            "true",
        ],
    );
    assert!(
        !o.status.success()
            && String::from_utf8_lossy(&o.stderr).contains("AssocGrpSubmitJobsLimit"),
        "{o:?}"
    );
    s.unblock_account(&acct(&t), Limit::At(200)).await.unwrap();
    assert!(test_only().status.success());

    assert!(matches!(
        s.delete_user_association(&user(unix), &acct(&a))
            .await
            .unwrap(),
        Deleted::Deleted { .. }
    ));
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
    let _c = Cleanup {
        accounts: vec![a.clone(), t.clone()],
        users: vec![],
    };
    s.ensure_tenant(&tenant(&t, &[&a])).await.unwrap();
    let spec = UserSpec {
        user: user(unix),
        account: acct(&a),
        default_account: true,
        limits: user_limits(),
    };
    s.ensure_user(&spec).await.unwrap();
    let bob = JobScope::User(user(unix));
    let _node = NODE.lock().await;

    let running = sbatch(unix, &a, "2");
    eventually(Duration::from_secs(60), "the first job to run", || async {
        let j = s.jobs(&bob).await.unwrap();
        j.iter()
            .any(|j| j.id == running && j.state == JobState::Running)
            .then_some(())
    })
    .await;
    let pending = sbatch(unix, &a, "2");
    let jobs = s.jobs(&JobScope::Account(acct(&a))).await.unwrap();
    assert!(
        jobs.iter()
            .any(|j| j.id == pending && j.state == JobState::Pending),
        "{jobs:?}"
    );

    let c = s.cancel_pending(&bob).await.unwrap();
    assert_eq!(c.cancelled, vec![pending.clone()]);
    assert_eq!(s.cancel_pending(&bob).await.unwrap(), Cancelled::default());
    let jobs = s.jobs(&bob).await.unwrap();
    assert_eq!(
        jobs.iter()
            .map(|j| (j.id.clone(), j.state.clone()))
            .collect::<Vec<_>>(),
        [(running.clone(), JobState::Running)]
    );

    for e in [
        s.delete_user(&user(unix)).await.unwrap_err(),
        s.delete_account(&acct(&t)).await.unwrap_err(),
    ] {
        assert!(
            matches!(&e, SlurmError::JobsActive { jobs, .. } if jobs == std::slice::from_ref(&running)),
            "{e:?}"
        );
    }
    assert!(s.user(&user(unix)).await.unwrap().is_some(), "still there");

    let c = s.cancel_all(&JobScope::Account(acct(&t))).await.unwrap();
    assert!(
        c.cancelled.contains(&running) || c.remaining.iter().any(|j| j.id == running),
        "{c:?}"
    );
    eventually(Duration::from_secs(60), "the job to end", || async {
        s.jobs(&bob).await.unwrap().is_empty().then_some(())
    })
    .await;
    drop(_node);
    // slurmdbd learns of the job's end a moment after slurmctld: the refusal is retryable.
    let gone = eventually(
        Duration::from_secs(30),
        "the delete to be accepted",
        || async {
            match s.delete_user(&user(unix)).await {
                Ok(d) => Some(d),
                Err(e) if e.is_retryable() => None,
                Err(e) => panic!("{e}"),
            }
        },
    )
    .await;
    assert!(matches!(gone, Deleted::Deleted { .. }), "{gone:?}");
    assert_eq!(
        s.delete_user(&user(unix)).await.unwrap(),
        Deleted::AlreadyGone
    );
    assert!(matches!(
        s.delete_account(&acct(&t)).await.unwrap(),
        Deleted::Deleted { .. }
    ));
}

#[tokio::test]
async fn archive_dump_reports_what_it_really_wrote() {
    let s = slurm();
    let dir = std::env::temp_dir().join(uniq("archive"));
    std::fs::create_dir_all(&dir).unwrap();
    let ok = std::process::Command::new("chown")
        .args(["slurm", dir.to_str().unwrap()])
        .status()
        .unwrap();
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

/// Runs every command as `env SLURM_CONF=<conf> …`: a slurm.conf whose slurmdbd port is closed.
struct BadConf(String);

impl Transport for BadConf {
    fn run<'a>(&'a self, cmd: &'a Command, timeout: Duration) -> RunFuture<'a> {
        let c = Command::new("env")
            .arg(format!("SLURM_CONF={}", self.0))
            .args(cmd.argv().iter().cloned());
        Box::pin(async move { LOCAL.run(&c, timeout).await })
    }
}

#[tokio::test]
async fn an_unreachable_slurmdbd_is_retryable() {
    cluster_up();
    let conf = std::env::temp_dir().join(format!("{}.conf", uniq("badslurm")));
    let real = std::fs::read_to_string("/etc/slurm/slurm.conf").unwrap();
    let bad: String = real
        .lines()
        .filter(|l| !l.starts_with("AccountingStoragePort"))
        .map(|l| {
            if l.starts_with("AccountingStorageHost") {
                format!("{l}\nAccountingStoragePort=1\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&conf, bad).unwrap();
    let s = SlurmCli::new(Arc::new(BadConf(conf.to_str().unwrap().into())), cluster());
    let e = s.ensure_tenant(&tenant(&uniq("t"), &[])).await.unwrap_err();
    assert!(
        matches!(e, SlurmError::Unreachable { .. }) && e.is_retryable(),
        "{e:?}"
    );
    std::fs::remove_file(&conf).unwrap();
}

#[tokio::test]
async fn hostile_names_never_reach_an_argv() {
    for s in [
        "-rf",
        "--help",
        "a;rm -rf /",
        "$(id)",
        "`id`",
        "a b",
        "ünï",
        "a,b",
        "a=b",
        "a|b",
        "x\ny",
        "'",
        "Alice",
    ] {
        assert!(Username::parse(s).is_err(), "{s:?}");
        assert!(SlurmAccount::parse(s).is_err(), "{s:?}");
        assert!(QosName::parse(s).is_err(), "{s:?}");
        assert!(ClusterName::parse(s).is_err(), "{s:?}");
    }
    for s in ["-x", "a=b", "a,b", "$(id)", "a;b", "ünï", "a\nb"] {
        assert!(SlurmText::parse(s).is_err(), "{s:?}");
    }
    // Everything that does reach an argv is one element each, with only expected characters.
    let rec = onramp::exec::Recorder::new();
    let s = SlurmCli::new(Arc::new(rec.clone()), cluster());
    let spec = tenant("tenant-foo", &["ml-team-foo"]);
    let _ = s.ensure_tenant(&spec).await;
    let u = UserSpec {
        user: user("alice"),
        account: acct("ml-team-foo"),
        default_account: true,
        limits: user_limits(),
    };
    let _ = s.ensure_user(&u).await;
    let _ = s
        .add_users(
            &acct("ml-team-foo"),
            &[user("bob"), user("carol")],
            true,
            &user_limits(),
        )
        .await;
    let _ = s.block_user(&user("alice")).await;
    let _ = s.cancel_pending(&JobScope::User(user("alice"))).await;
    let _ = s.delete_account(&acct("tenant-foo")).await;
    let cmds = rec.commands();
    assert!(cmds.len() >= 6);
    for c in &cmds {
        for a in c.argv() {
            let text_value = a.starts_with("Description=") || a.starts_with("Organization=");
            assert!(
                a.chars().all(|ch| ch.is_ascii_alphanumeric()
                    || "-_=,/.%|".contains(ch)
                    || (text_value && ch == ' ')),
                "{a:?} in {c}"
            );
        }
    }
}

#[test]
fn doctor_reports_what_the_test_cluster_really_lacks() {
    cluster_up();
    let config = std::process::Command::new("scontrol")
        .args(["show", "config"])
        .output()
        .unwrap();
    let config = onramp::slurm::parse::config(&String::from_utf8_lossy(&config.stdout));
    let doctor = |extra: &[&str]| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_onramp"))
            .args(["doctor", "--json"])
            .args(extra)
            .output()
            .unwrap();
        let v: serde_json::Value =
            serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {o:?}"));
        (o.status.code(), v)
    };
    let status = |v: &serde_json::Value, s: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["setting"] == s)
            .unwrap()["status"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (code, v) = doctor(&[]);
    let want = |ok: bool| if ok { "ok" } else { "missing" };
    assert_eq!(
        status(&v, "ProctrackType"),
        want(config["ProctrackType"] == "proctrack/cgroup")
    );
    assert_eq!(
        status(&v, "TaskPlugin"),
        want(config["TaskPlugin"].contains("task/cgroup"))
    );
    assert_eq!(
        status(&v, "PrologFlags"),
        want(config["PrologFlags"].contains("Contain"))
    );
    assert_eq!(
        status(&v, "AccountingStorageEnforce"),
        "ok",
        "the script sets associations,limits,qos,safe"
    );
    assert_eq!(
        status(&v, "PriorityFlags"),
        "ok",
        "fair tree is 22.05's default: {v}"
    );
    if !std::path::Path::new("/etc/slurm/cgroup.conf").exists() {
        assert_eq!(status(&v, "ConstrainDevices"), "unknown");
    }
    assert_eq!(code, Some(if v["ok"] == true { 0 } else { 1 }));
    assert_eq!(
        v["ok"],
        config["ProctrackType"] == "proctrack/cgroup" && config["PrologFlags"].contains("Contain")
    );

    let cg = std::env::temp_dir().join(format!("{}.conf", uniq("cgroup")));
    std::fs::write(
        &cg,
        "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=yes\n",
    )
    .unwrap();
    let (_, v) = doctor(&["--cgroup-conf", cg.to_str().unwrap()]);
    assert_eq!(
        (status(&v, "ConstrainDevices"), status(&v, "ConstrainCores")),
        ("ok".into(), "ok".into())
    );
    assert_eq!(status(&v, "ConstrainRAMSpace"), "missing");
    std::fs::remove_file(&cg).unwrap();
}

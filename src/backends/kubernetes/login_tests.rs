//! Tests of `login.rs` (the login pod's work through a recording transport).

use super::*;
use crate::dryrun::Recorder;

fn pod(r: &Recorder) -> LoginPod {
    LoginPod::new(Arc::new(r.clone()), K8sSettings::default(), Duration::from_secs(5))
}

#[tokio::test]
async fn existing_home_is_left_alone() {
    let r = Recorder::replying(|_| Output { stdout: "5001:5001\n".into(), ..Default::default() });
    let u = Username::parse("alice").unwrap();
    assert_eq!(pod(&r).ensure_home(&u, 5001, 5001).await.unwrap(), HomeOutcome::Unchanged);
    assert_eq!(r.commands().len(), 1);
    let e = pod(&r).ensure_home(&u, 5002, 5002).await.unwrap_err();
    assert!(matches!(e, LoginError::HomeOwner { .. }) && !e.is_retryable());
}

#[tokio::test]
async fn new_home_is_built_aside_and_renamed() {
    let r = Recorder::replying(|c| match c.argv()[0].as_str() {
        "stat" | "test" => Output { code: 1, ..Default::default() },
        _ => Output::default(),
    });
    let u = Username::parse("alice").unwrap();
    assert_eq!(pod(&r).ensure_home(&u, 5001, 5001).await.unwrap(), HomeOutcome::Created);
    let cmds: Vec<String> = r.commands().iter().map(|c| c.to_string()).collect();
    assert_eq!(cmds.last().unwrap(), "mv -T -- /home/.onramp-new-alice /home/alice");
    assert!(cmds.contains(&"chown -R -- 5001:5001 /home/.onramp-new-alice".to_string()));
}

#[test]
fn smoke_commands_and_diagnosis() {
    let r = Recorder::new();
    let (u, a) = (Username::parse("alice").unwrap(), SlurmAccount::parse("tenant-foo").unwrap());
    let c = pod(&r).sbatch_test(&u, &a);
    assert_eq!(c.argv()[..4], ["sudo", "-u", "alice", "-i"]);
    assert_eq!(c.argv().last().unwrap(), "echo ok");
    assert!(c.argv().contains(&"--gres=gpu:1".to_string()));
    let c = pod(&r).srun_ids(&u, &a);
    assert_eq!(c.argv()[4..6], ["srun", "--quiet"]);
    for arg in ["--account=tenant-foo", "--gres=gpu:1", "--immediate=2", "--time=1"] {
        assert!(c.argv().contains(&arg.to_string()), "{arg} in {c}");
    }
    let rep = SmokeReport {
        uid: Some(65534),
        gid: Some(65534),
        expected: (5001, 5001),
        sbatch: Output::default(),
        accounts: vec!["tenant-foo".into()],
        account: "tenant-foo".into(),
        compute: ComputeIds { uid: Some(5001), gid: Some(5001), node: "worker-0".into(), ..Default::default() },
    };
    assert_eq!(rep.problems().len(), 1);
    assert!(rep.problems()[0].contains("nobody"));
}

/// The pods answer `id` with `login` and srun's job step with `compute`.
fn answering(login: &'static str, compute: Output) -> Recorder {
    Recorder::replying(move |c| match c.argv().get(4).map(String::as_str) {
        Some("id") => Output { stdout: login.into(), ..Default::default() },
        Some("srun") => compute.clone(),
        Some("sacctmgr") => Output { stdout: "tenant-foo\n".into(), ..Default::default() },
        _ => Output::default(),
    })
}

#[tokio::test]
async fn a_compute_node_that_resolves_other_numbers_fails_with_the_runbooks_diagnosis() {
    let (u, a) = (Username::parse("alice").unwrap(), SlurmAccount::parse("tenant-foo").unwrap());
    let login = "uid=5001(alice) gid=5001(alice) groups=5001(alice)\n";
    let same = Output { stdout: "5001\n5001\nworker-0\n".into(), ..Default::default() };
    let rep = pod(&answering(login, same)).smoke_test(&u, &a, 5001, 5001).await.unwrap();
    assert!(rep.passed(), "{:?}", rep.problems());
    assert_eq!((rep.compute.uid, rep.compute.gid, rep.compute.node.as_str()), (Some(5001), Some(5001), "worker-0"));

    // slurmd's nslcd numbers users differently: the login pod is right, the node is not.
    let drift = Output { stdout: "65534\n65534\nworker-3\n".into(), ..Default::default() };
    let rep = pod(&answering(login, drift)).smoke_test(&u, &a, 5001, 5001).await.unwrap();
    let p = rep.problems();
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].contains("login pod (id): uid 5001 gid 5001"), "{}", p[0]);
    assert!(p[0].contains("slurmd on worker-3 (srun id): uid 65534 gid 65534"), "{}", p[0]);
    assert!(p[0].contains(NOBODY_DIAGNOSIS), "{}", p[0]);

    // srun refused: said with Slurm's words; no free node within the wait is worth a retry
    let srun = |e: &str| Output {
        code: 1,
        stderr: format!("srun: error: Unable to allocate resources: {e}\n"),
        ..Default::default()
    };
    let rep = pod(&answering(login, srun("Invalid account"))).smoke_test(&u, &a, 5001, 5001).await.unwrap();
    assert_eq!(
        rep.problems(),
        ["srun on a compute node failed (1): srun: error: Unable to allocate resources: Invalid account"]
    );
    assert_eq!(rep.retry_reason(), None);
    let rep = pod(&answering(login, srun("Requested nodes are busy"))).smoke_test(&u, &a, 5001, 5001).await.unwrap();
    assert!(rep.retry_reason().is_some_and(|r| r.contains("no compute node was free")), "{rep:?}");
    // Unreadable output is an error, not a pass.
    let junk = Output { stdout: "hello\n".into(), ..Default::default() };
    let e = pod(&answering(login, junk)).smoke_test(&u, &a, 5001, 5001).await.unwrap_err();
    assert!(matches!(e, LoginError::Unreadable { .. }), "{e:?}");
}

/// As [`answering`], and `squeue` and `sacct` answer (the smoke jobs of earlier attempts).
fn answering_slurm(squeue_out: &'static str, sacct_out: &'static str) -> Recorder {
    let login = "uid=5001(alice) gid=5001(alice) groups=5001(alice)\n";
    Recorder::replying(move |c| match c.argv().get(4).map(String::as_str) {
        Some("id") => Output { stdout: login.into(), ..Default::default() },
        Some("srun") => Output { stdout: "5001\n5001\nworker-0\n".into(), ..Default::default() },
        Some("squeue") => Output { stdout: squeue_out.into(), ..Default::default() },
        Some("sacct") => Output { stdout: sacct_out.into(), ..Default::default() },
        Some("sacctmgr") => Output { stdout: "tenant-foo\n".into(), ..Default::default() },
        _ => Output::default(),
    })
}

#[tokio::test]
async fn a_smoke_job_an_earlier_attempt_completed_is_not_run_again() {
    let (u, a) = (Username::parse("alice").unwrap(), SlurmAccount::parse("tenant-foo").unwrap());
    let run = SmokeRun { name: "onramp-smoke-job7".into(), again: true };
    let sruns = |r: &Recorder| r.commands().iter().filter(|c| c.argv().get(4).is_some_and(|a| a == "srun")).count();

    // completed, as slurmctld still lists it or as accounting has it: taken from there, no srun
    let done = "41|COMPLETED|5001|5001|worker-1\n";
    for (squeue, sacct, asked) in [(done, "", "squeue"), ("", done, "sacct")] {
        let r = answering_slurm(squeue, sacct);
        let rep = pod(&r).smoke_test_once(&u, &a, (5001, 5001), &run).await.unwrap();
        assert!(rep.passed(), "{:?}", rep.problems());
        assert_eq!((rep.compute.uid, rep.compute.node.as_str()), (Some(5001), "worker-1"));
        assert_eq!(sruns(&r), 0);
        let look = r.commands().into_iter().find(|c| c.argv()[4] == asked).unwrap();
        assert!(look.argv().contains(&"--name=onramp-smoke-job7".to_string()), "{look}");
        if asked == "squeue" {
            assert!(look.argv().contains(&"--user=alice".to_string()), "{look}");
        }
    }

    // none, or only a failed one: run now, under the job's name
    for out in ["", "40|FAILED|5001|5001|worker-1\n"] {
        let r = answering_slurm(out, out);
        assert!(pod(&r).smoke_test_once(&u, &a, (5001, 5001), &run).await.unwrap().passed());
        assert_eq!(sruns(&r), 1);
        let srun = r.commands().into_iter().find(|c| c.argv()[4] == "srun").unwrap();
        assert!(srun.argv().contains(&"--job-name=onramp-smoke-job7".to_string()), "{srun}");
    }

    // still running: wait for it (retryable), run nothing
    let r = answering_slurm("42|RUNNING|5001|5001|worker-1\n", "");
    let e = pod(&r).smoke_test_once(&u, &a, (5001, 5001), &run).await.unwrap_err();
    assert!(e.is_retryable() && e.to_string().contains("still RUNNING"), "{e}");
    assert_eq!(sruns(&r), 0);

    // a first attempt does not look
    let r = answering_slurm(done, done);
    let first = SmokeRun { again: false, ..run };
    pod(&r).smoke_test_once(&u, &a, (5001, 5001), &first).await.unwrap();
    let looked = r.commands().iter().any(|c| ["squeue", "sacct"].contains(&c.argv()[4].as_str()));
    assert_eq!((sruns(&r), looked), (1, false));
}

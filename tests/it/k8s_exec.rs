//! Exec over WebSocket through the fake API server, which runs the argv here: `deploy/slurmctld`
//! reaches the real test Slurm cluster; `login-0` really creates home directories (in a temp
//! root) and really runs `sbatch --test-only` as a unix user.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::sync::Arc;
use std::time::Duration;

use axum::http::Method;
use onramp::backends::exec::{Command, Local, Transport, TransportError};
use onramp::backends::kubernetes::exec::{PodExec, PodTarget};
use onramp::backends::kubernetes::keys::KeyState;
use onramp::backends::kubernetes::login::{HomeOutcome, LoginPod};
use onramp::domain::names::{SlurmAccount, Username};
use onramp::domain::sshkey::PublicKey;
use onramp::domain::tenants::K8sNames;

use crate::k8s_support::{TENANT, client, cluster, tenant};
use onramp_fakes::k8s::Fault;

const T: Duration = Duration::from_secs(30);

#[tokio::test]
async fn slurmctld_exec_runs_real_sacctmgr_over_v5_and_v4() {
    let (fake, k8s) = cluster().await;
    let ctld = PodExec::slurmctld(&k8s);
    assert_eq!(ctld.resolve().await.unwrap(), "slurmctld-1", "the Ready pod of the Deployment");
    let show = Command::new("sacctmgr").args(["-n", "-P", "show", "cluster", "format=cluster"]);
    for protocols in [vec!["v5.channel.k8s.io"], vec!["v4.channel.k8s.io"]] {
        fake.protocols(protocols.clone());
        let out = ctld.run(&show, T).await.unwrap();
        assert_eq!((out.code, out.stdout.trim()), (0, "production"), "{protocols:?}: {out:?}");
    }
    let local = Local.run(&show, T).await.unwrap();
    let out = ctld.run(&show, T).await.unwrap();
    assert_eq!(out, local, "exec gives what running it here gives");

    // A failing command: its exit code from the status channel, its stderr.
    let bad = Command::new("sacctmgr").args(["-n", "show", "nonsense"]);
    let out = ctld.run(&bad, T).await.unwrap();
    assert_ne!(out.code, 0);
    assert!(!out.stderr.is_empty(), "{out:?}");
    let out = ctld.run(&Command::new("sh").args(["-c", "echo out; echo err >&2; exit 7"]), T).await.unwrap();
    assert_eq!((out.code, out.stdout.as_str(), out.stderr.as_str()), (7, "out\n", "err\n"));
    let e = ctld.run(&Command::new("/nonexistent/sacctmgr"), T).await.unwrap_err();
    assert!(matches!(e, TransportError::Spawn { .. }), "{e:?}");
}

#[tokio::test]
async fn connects_through_a_kubeconfig() {
    let (fake, _) = cluster().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    let kc = format!(
        "apiVersion: v1\nkind: Config\ncurrent-context: other\nclusters:\n- name: fake\n  cluster:\n    server: {}\n\
         - name: wrong\n  cluster:\n    server: http://127.0.0.1:9\ncontexts:\n- name: test\n  context:\n    cluster: fake\n    user: u\n\
         - name: other\n  context:\n    cluster: wrong\n    user: u\nusers:\n- name: u\n  user:\n    token: t0k3n\n",
        fake.url
    );
    std::fs::write(&path, kc).unwrap();
    let s = onramp::backends::kubernetes::K8sSettings {
        kubeconfig: Some(path),
        k8s_context: Some("test".into()),
        ..Default::default()
    };
    let k8s = onramp::backends::kubernetes::K8s::connect(s).await.unwrap();
    let out = PodExec::slurmctld(&k8s).run(&Command::new("echo").arg("hi"), T).await.unwrap();
    assert_eq!(out.stdout, "hi\n");
}

#[tokio::test]
async fn exec_faults_are_typed() {
    let (fake, k8s) = cluster().await;
    let ctld = PodExec::slurmctld(&k8s);
    let cmd = Command::new("sh").args(["-c", "echo first; sleep 0.2; echo second"]);

    fake.fault(Method::GET, "/exec", Fault::DropExec);
    let e = ctld.run(&cmd, T).await.unwrap_err();
    assert!(matches!(&e, TransportError::Transient(m) if m.contains("before the exit status")), "{e:?}");

    fake.fault(Method::GET, "/exec", Fault::Status(500, None));
    assert!(matches!(ctld.run(&cmd, T).await.unwrap_err(), TransportError::Transient(_)));
    // a 429 keeps its Retry-After, for the engine to wait that long before the next attempt
    fake.fault(Method::GET, "/deployments/slurmctld", Fault::Status(429, Some(2)));
    let e = ctld.run(&cmd, T).await.unwrap_err();
    assert!(matches!(&e, TransportError::Busy { retry_after, .. } if *retry_after == Duration::from_secs(2)), "{e:?}");
    assert!(e.is_transient());

    fake.fault(Method::GET, "/exec", Fault::Status(403, None));
    let e = ctld.run(&cmd, T).await.unwrap_err();
    assert!(
        matches!(&e, TransportError::Permanent(m) if m.contains("\"create\" on \"pods/exec\" in namespace slurm-control")),
        "{e:?}"
    );

    let e = ctld.run(&Command::new("sleep").arg("5"), Duration::from_millis(300)).await.unwrap_err();
    assert!(matches!(e, TransportError::Timeout { .. }), "{e:?}");

    // No Ready pod: retryable (it may become Ready); no such pod: permanent.
    fake.pod("slurm-control", "slurmctld-1", serde_json::json!({"app": "slurmctld"}), false);
    let e = ctld.run(&cmd, T).await.unwrap_err();
    assert!(matches!(&e, TransportError::Transient(m) if m.contains("no Ready pod")), "{e:?}");
    let gone = PodExec::new(k8s.clone(), TENANT, PodTarget::Pod("login-9".into()), None);
    assert!(matches!(gone.run(&cmd, T).await.unwrap_err(), TransportError::Permanent(_)));
}

/// The registry's `login_pod: ""`: commands run in a Ready pod of the tenant's login Deployment,
/// in the tenant's namespace, in the container the registry names.
#[tokio::test]
async fn a_login_pod_named_by_its_deployment_is_a_ready_pod_of_it() {
    let (fake, k8s) = cluster().await;
    fake.pod(TENANT, "login-0", serde_json::json!({"app": "login"}), false);
    fake.pod(TENANT, "login-5d8f-x2", serde_json::json!({"app": "login"}), true);
    let names = K8sNames { login_pod: None, login_container: Some("main".into()), ..tenant() };
    let exec = PodExec::login(&k8s, &names);
    assert_eq!(exec.resolve().await.unwrap(), "login-5d8f-x2");
    let out = exec.run(&Command::new("echo").arg("hi"), T).await.unwrap();
    assert_eq!(out.stdout, "hi\n");
    let paths = fake.requests().into_iter().map(|(_, p)| p.split('?').next().unwrap_or_default().to_string());
    let mut execs: Vec<String> = paths.filter(|p| p.ends_with("/exec")).collect();
    execs.dedup(); // the fake logs the upgrade and the exec
    assert_eq!(execs, ["/api/v1/namespaces/tenant-foo/pods/login-5d8f-x2/exec"], "{execs:?}");
}

struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("onramp-login-").tempdir().unwrap();
        for d in ["home", "skel/.config", "keys"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        std::fs::write(dir.path().join("skel/.bashrc"), "# skel bashrc\n").unwrap();
        std::fs::write(dir.path().join("skel/.config/app.conf"), "x=1\n").unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        Self { dir }
    }
    fn path(&self, p: &str) -> std::path::PathBuf {
        self.dir.path().join(p)
    }
}

/// Runs `sacctmgr` here, returning stdout.
async fn sacctmgr(args: &[&str]) -> String {
    let o = Local.run(&Command::new("sacctmgr").args(args.iter().copied()), T).await.unwrap();
    assert!(o.success(), "sacctmgr {args:?}: {o:?}");
    o.stdout
}

#[tokio::test]
async fn login_pod_home_keys_and_smoke_test_for_real() {
    let (fake, _) = cluster().await;
    let s = Scratch::new();
    let root = s.dir.path().to_str().unwrap().to_string();
    let k8s = client(&fake, |a| {
        a.home_root = format!("{root}/home");
        a.skel_dir = format!("{root}/skel");
        a.authorized_keys_dir = format!("{root}/keys");
        // No sudo on this machine; runuser becomes the user the same way (argv, no shell).
        a.login_run_as = "runuser -u {user} --".into();
    });
    let login = LoginPod::new(Arc::new(PodExec::login(&k8s, &tenant())), k8s.settings().clone(), T);
    let user = Username::parse("onramp-dave").unwrap();
    let (uid, gid) = (5004, 5004);

    // $HOME: created with owner by number, mode 700, skel copied.
    assert_eq!(login.ensure_home(&user, uid, gid).await.unwrap(), HomeOutcome::Created);
    let home = s.path("home/onramp-dave");
    let meta = std::fs::metadata(&home).unwrap();
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (uid, gid, 0o700));
    let rc = home.join(".config/app.conf");
    assert_eq!(std::fs::metadata(&rc).unwrap().uid(), uid);
    assert_eq!(std::fs::read_to_string(home.join(".bashrc")).unwrap(), "# skel bashrc\n");

    // The user writes files and edits a skel file; a second run changes nothing.
    std::fs::write(home.join("results.txt"), "mine\n").unwrap();
    std::fs::write(home.join(".bashrc"), "# my own\n").unwrap();
    let before = snapshot(&home);
    assert_eq!(login.ensure_home(&user, uid, gid).await.unwrap(), HomeOutcome::Unchanged);
    assert_eq!(snapshot(&home), before);
    assert_eq!(std::fs::read_to_string(home.join(".bashrc")).unwrap(), "# my own\n");
    assert!(!s.path("home/.onramp-new-onramp-dave").exists());
    // A home owned by someone else (LDAP was down when pam_mkhomedir ran): a clear error.
    let err = login.ensure_home(&user, 5003, 5003).await.unwrap_err();
    assert!(err.to_string().contains("owned by 5004:5004, not 5003:5003"), "{err}");

    // Key projection: missing, then present.
    let key =
        PublicKey::parse("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl d").unwrap();
    assert_eq!(login.key_projected(&user, &key).await.unwrap(), KeyState::Missing);
    std::fs::write(s.path("keys/onramp-dave"), format!("{}\n", key.to_line())).unwrap();
    assert_eq!(login.key_projected(&user, &key).await.unwrap(), KeyState::Matches);

    // Smoke test as the real unix user, against the real Slurm: first without an association.
    let account = SlurmAccount::parse(&format!("onramp-k8s-{}", std::process::id())).unwrap();
    let report = login.smoke_test(&user, &account, uid, gid).await.unwrap();
    assert!(!report.passed());
    assert!(report.problems().iter().any(|p| p.contains("sbatch --test-only failed")), "{:?}", report.problems());

    let acct = account.to_string();
    sacctmgr(&["-i", "add", "account", &acct, "Description=onramp k8s test", "Organization=onramp"]).await;
    sacctmgr(&["-i", "add", "user", "onramp-dave", &format!("Account={acct}")]).await;
    let report = login.smoke_test(&user, &account, uid, gid).await;
    // Clean up before asserting: the smoke test's srun job reaches slurmdbd as ended a few
    // seconds after it ends, and slurmdbd refuses the delete ("Job(s) active") until then.
    let user_arg = format!("account={acct}");
    for args in
        [&["-i", "delete", "user", "name=onramp-dave", user_arg.as_str()][..], &["-i", "delete", "account", &acct]]
    {
        crate::common::eventually(Duration::from_secs(60), "slurmdbd to allow the delete", || async {
            let o = Local.run(&Command::new("sacctmgr").args(args.iter().copied()), T).await.unwrap();
            o.success().then_some(())
        })
        .await;
    }
    let report = report.unwrap();
    assert!(report.passed(), "{:?} {:?}", report.problems(), report);
    assert_eq!((report.uid, report.gid), (Some(uid), Some(gid)));
    assert!(report.sbatch.stderr.contains("to start at"), "sbatch --test-only reports on stderr: {:?}", report.sbatch);
    // A uid mismatch is the runbook's "files owned by nobody" diagnosis.
    let mut wrong = report.clone();
    wrong.expected = (5001, 5001);
    assert!(wrong.problems()[0].contains("LDAP"));
}

/// Every path under `dir` with its owner, mode, size and modification time.
fn snapshot(dir: &std::path::Path) -> Vec<(String, u32, u32, u64, i64)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).unwrap();
        out.push((p.display().to_string(), m.uid(), m.mode(), m.len(), m.mtime_nsec() + m.mtime() * 1_000_000_000));
        if m.is_dir() {
            stack.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
        }
    }
    out.sort();
    out
}

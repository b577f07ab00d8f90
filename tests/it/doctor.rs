//! `onramp doctor`: the Slurm items against the real test cluster (through the Slurm route), the
//! pod items against the fake Kubernetes API, whose execs see each pod's own files (the
//! `fake.onramp.dev/files` overlay: nslcd.conf, /etc/pam.d, /proc/mounts).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use onramp::backends::exec::Local;
use onramp::backends::slurm::SlurmCli;
use onramp::doctor::k8s::{PodSettings, check};
use onramp::doctor::{Report, Severity, Status};
use onramp::domain::names::ClusterName;
use onramp::domain::tenants::TenantRegistry;
use onramp_fakes::k8s::FakeK8s;
use serde_json::{Value, json};

use crate::k8s_support::client;

const NSLCD: &str = "uri ldap://authentik-ldap.auth.svc:389\nbase dc=ldap,dc=goauthentik,dc=io\n\
    binddn cn=ldapservice,ou=users,dc=ldap,dc=goauthentik,dc=io\nbindpw s3cret\n\
    map passwd uidNumber uidNumber\nmap group gidNumber gidNumber\nfilter passwd (objectClass=user)\n";
const PAM_ADOPT: &str = "auth required pam_unix.so\naccount required pam_slurm_adopt.so\n";
const PAM_PLAIN: &str =
    "auth required pam_unix.so\n# account required pam_slurm_adopt.so\naccount required pam_unix.so\n";

/// Writes `files` (path under the pod's root → text) into `dir` for the fake's overlay.
fn pod_files(dir: &Path, files: &[(&str, &str)]) {
    for (path, text) in files {
        let p = dir.join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
}

/// A Ready pod with volumes mounted at paths (`(mountPath, volume)`) and its own files.
fn pod(ns: &str, name: &str, labels: Value, mounts: &[(&str, Value)], files: &Path) -> Value {
    let vm: Vec<Value> = mounts.iter().map(|(p, v)| json!({"name": v["name"], "mountPath": p})).collect();
    let vols: Vec<Value> = mounts.iter().map(|(_, v)| v.clone()).collect();
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": labels,
                     "annotations": {"fake.onramp.dev/files": files.to_str().unwrap()}},
        "spec": {"containers": [{"name": "main", "volumeMounts": vm}], "volumes": vols},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}})
}

fn secret(name: &str, secret: &str) -> Value {
    json!({"name": name, "secret": {"secretName": secret}})
}

fn put_pod(fake: &FakeK8s, p: Value) {
    let (ns, name) = (p["metadata"]["namespace"].as_str().unwrap(), p["metadata"]["name"].as_str().unwrap());
    fake.put(&format!("/api/v1/namespaces/{ns}/pods/{name}"), p.clone());
}

fn settings(reg: Option<TenantRegistry>) -> PodSettings {
    PodSettings {
        tenants: reg,
        slurmd_namespace: "slurm".into(),
        slurmd_selector: "app.kubernetes.io/name=slurmd".into(),
        authorized_keys_dir: "/etc/ssh/authorized_keys.d".into(),
        exec_timeout: Duration::from_secs(20),
    }
}

fn registry() -> TenantRegistry {
    let yaml = "tenants:\n- { name: foo, group: tenant-foo-users }\n- { name: bar, group: tenant-bar-users }\n";
    TenantRegistry::parse(yaml, "test").unwrap()
}

fn st(r: &Report, id: &str) -> (Status, Severity) {
    let f = r.get(id).unwrap_or_else(|| panic!("no {id} in {}", onramp::doctor::render::text(r)));
    (f.status, f.severity)
}

/// The slurmd pod, and tenant foo's and bar's login pods; `good` decides whether everything is as
/// the runbook wants, else: the LDAP bind password from a ConfigMap on slurmd, no
/// pam_slurm_adopt, bar's uid mapping drifted, bar's munge key baked in and its keys Secret not
/// mounted, and a wekafs mount of tenant-bar's scratch left on foo's login pod.
fn world(fake: &FakeK8s, root: &Path, good: bool) {
    let (d, f, b) = (root.join("slurmd"), root.join("foo"), root.join("bar"));
    let munge = ("/etc/munge", secret("munge", "munge-key"));
    let ldap = ("/etc/nslcd.conf", secret("nslcd", "nslcd-conf"));
    let ldap_cm = ("/etc/nslcd.conf", json!({"name": "nslcd", "configMap": {"name": "nslcd"}}));
    let keys = |s: &str| ("/etc/ssh/authorized_keys.d", secret("keys", s));
    let weka_foo = "fs0/tenant-foo /tenant/tenant-foo/scratch wekafs rw,relatime 0 0\n";
    let weka_bar = "fs0/tenant-bar /tenant/tenant-bar/scratch wekafs rw,relatime 0 0\n";
    let base = "/dev/vda / ext4 rw 0 0\n";
    pod_files(&d, &[("/etc/nslcd.conf", NSLCD), ("/etc/pam.d/sshd", if good { PAM_ADOPT } else { PAM_PLAIN })]);
    pod_files(
        &f,
        &[
            ("/etc/nslcd.conf", NSLCD),
            ("/proc/mounts", &format!("{base}{weka_foo}{}", if good { "" } else { weka_bar })),
        ],
    );
    let drifted = NSLCD.replace("map passwd uidNumber uidNumber", "map passwd uidNumber employeeNumber");
    pod_files(
        &b,
        &[("/etc/nslcd.conf", if good { NSLCD } else { &drifted }), ("/proc/mounts", &format!("{base}{weka_bar}"))],
    );
    let sd = json!({"app.kubernetes.io/name": "slurmd"});
    let slurmd_ldap = if good { ldap.clone() } else { ldap_cm };
    put_pod(fake, pod("slurm", "compute-0", sd, &[munge.clone(), slurmd_ldap], &d));
    put_pod(fake, pod("slurm", "other-0", json!({"app": "x"}), &[], &d));
    let login = json!({"app": "login"});
    for (ns, dir, mounts) in [
        ("tenant-foo", &f, vec![munge.clone(), ldap.clone(), keys("tenant-foo-authorized-keys")]),
        (
            "tenant-bar",
            &b,
            if good {
                vec![munge.clone(), ldap.clone(), keys("tenant-bar-authorized-keys")]
            } else {
                vec![ldap.clone(), keys("tenant-foo-authorized-keys")]
            },
        ),
    ] {
        fake.deployment(ns, "login", login.clone());
        put_pod(fake, pod(ns, "login-0", login.clone(), &mounts, dir));
    }
}

#[tokio::test]
async fn pods_without_the_runbooks_mounts_and_files_are_findings_with_their_severity() {
    let fake = FakeK8s::start().await;
    let root = tempfile::tempdir().unwrap();
    world(&fake, root.path(), false);
    let k8s = client(&fake, |s| s.k8s_timeout = Duration::from_secs(10));
    let r = Report::new("production".into(), "22.05.8".into(), check(Ok(&k8s), &settings(Some(registry()))).await);
    let text = onramp::doctor::render::text(&r);
    use {Severity::*, Status::Finding, Status::Ok as OK};
    for (id, want) in [
        ("pods.munge_key.slurmd", (OK, Critical)),
        ("pods.ldap_credentials.slurmd", (Finding, Critical)),
        ("pods.pam_slurm_adopt.slurmd", (Finding, Warning)),
        ("pods.munge_key.login.foo", (OK, Critical)),
        ("pods.ldap_credentials.login.foo", (OK, Critical)),
        ("pods.authorized_keys.login.foo", (OK, Critical)),
        ("pods.nslcd_ids.login.foo", (OK, Critical)),
        ("pods.weka_mounts.login.foo", (Finding, Critical)),
        ("pods.munge_key.login.bar", (Finding, Critical)),
        ("pods.authorized_keys.login.bar", (Finding, Critical)),
        ("pods.nslcd_ids.login.bar", (Finding, Critical)),
        ("pods.weka_mounts.login.bar", (OK, Critical)),
    ] {
        assert_eq!(st(&r, id), want, "{id}:\n{text}");
    }
    let weka = r.get("pods.weka_mounts.login.foo").unwrap();
    assert_eq!(weka.found, "fs0/tenant-bar on /tenant/tenant-bar/scratch");
    let ids = r.get("pods.nslcd_ids.login.bar").unwrap();
    assert!(ids.found.contains("employeeNumber") && ids.consequence.contains("nobody:nogroup"), "{ids:?}");
    assert!(r.get("pods.munge_key.login.bar").unwrap().found.contains("the image"));
    assert!(r.get("pods.ldap_credentials.slurmd").unwrap().found.contains("configMap nslcd"));
    assert_eq!(r.summary.exit_code, 2, "{text}");
    // the execs read the pods' own files, in the right pods
    let execs = fake.execs();
    assert!(execs.iter().any(|e| e.pod == "compute-0" && e.argv[0] == "grep"), "{execs:?}");
    assert!(!execs.iter().any(|e| e.pod == "other-0"));
}

#[tokio::test]
async fn pods_as_the_runbook_has_them_pass_and_without_an_api_nothing_is_claimed() {
    let fake = FakeK8s::start().await;
    let root = tempfile::tempdir().unwrap();
    world(&fake, root.path(), true);
    let k8s = client(&fake, |s| s.k8s_timeout = Duration::from_secs(10));
    let r = Report::new("production".into(), "22.05.8".into(), check(Ok(&k8s), &settings(Some(registry()))).await);
    let text = onramp::doctor::render::text(&r);
    assert!(r.findings.iter().all(|f| f.status == Status::Ok), "{text}");
    assert_eq!((r.summary.ok, r.summary.exit_code), (3 + 2 * 5, 0), "{text}");

    // without the registry: the slurmd pod only, the login pods skipped with why
    let r = Report::new("p".into(), "v".into(), check(Ok(&k8s), &settings(None)).await);
    assert_eq!(st(&r, "pods.pam_slurm_adopt.slurmd").0, Status::Ok);
    let skipped = r.get("pods.nslcd_ids.login").unwrap();
    assert_eq!(skipped.status, Status::NotChecked);
    assert!(skipped.note.as_deref().unwrap().contains("ONRAMP_TENANTS"));
    assert_eq!(r.summary.exit_code, 0);

    // no slurmd pod where the settings say: could not check (exit 3), the login pods still are
    let mut s = settings(Some(registry()));
    s.slurmd_selector = "app.kubernetes.io/name=nothing".into();
    let r = Report::new("p".into(), "v".into(), check(Ok(&k8s), &s).await);
    assert_eq!(st(&r, "pods.slurmd").0, Status::Unknown);
    assert_eq!(st(&r, "pods.authorized_keys.login.foo").0, Status::Ok);
    assert_eq!(r.summary.exit_code, 3);

    // a tenant's own slurmd pods (in its namespace) are checked for other tenants' mounts too
    let own = root.path().join("own");
    pod_files(&own, &[("/proc/mounts", "fs0/tenant-bar /scratch wekafs rw 0 0\n"), ("/etc/nslcd.conf", NSLCD)]);
    let sd = json!({"app.kubernetes.io/name": "slurmd"});
    let mut p = pod("tenant-foo", "foo-compute-0", sd, &[], &own);
    p["spec"]["containers"] = json!([{"name": "sidecar"}, {"name": "slurmd"}]);
    put_pod(&fake, p);
    s.slurmd_selector = "app.kubernetes.io/name=slurmd".into();
    s.slurmd_namespace = "tenant-foo".into();
    let r = Report::new("p".into(), "v".into(), check(Ok(&k8s), &s).await);
    assert_eq!(st(&r, "pods.weka_mounts.slurmd"), (Status::Finding, Severity::Critical));
    assert_eq!(r.get("pods.weka_mounts.slurmd").unwrap().found, "fs0/tenant-bar on /scratch");
    assert_eq!(st(&r, "pods.munge_key.slurmd").0, Status::Finding);

    let r = Report::new("p".into(), "v".into(), check(Err("no API".into()), &s).await);
    assert!(r.findings.iter().all(|f| f.status == Status::NotChecked));
    assert_eq!(r.summary.exit_code, 0);
}

/// The real test cluster: no cgroup plugin (proctrack/linuxproc, task/none, no cgroup.conf),
/// `Gres=gpu:8` with File= over null devices, PriorityDecayHalfLife at Slurm's default.
#[tokio::test]
async fn the_test_cluster_through_the_slurm_route() {
    crate::slurm::cluster_up();
    let slurm = SlurmCli::new(Arc::new(Local), ClusterName::parse("production").unwrap());
    let r = onramp::doctor::run(&slurm, None, "production", Err("no API".into()), &settings(None)).await.unwrap();
    let text = onramp::doctor::render::text(&r);
    use {Severity::*, Status::Finding, Status::Ok as OK, Status::Unknown};
    for (id, want) in [
        ("slurm.cluster_name", (OK, Critical)),
        ("slurm.accounting_storage_enforce", (OK, Critical)),
        ("slurm.proctrack_type", (Finding, Critical)),
        ("slurm.task_plugin", (Finding, Critical)),
        ("slurm.prolog_flags", (Finding, Critical)),
        ("slurm.fair_tree", (OK, Critical)),
        ("slurm.priority_decay_half_life", (Finding, Warning)),
        ("slurm.job_acct_gather_type", (Finding, Warning)),
        ("slurm.cgroup.plugin", (Unknown, Critical)),
        ("slurm.cgroup.constrain_devices", (Unknown, Critical)),
        ("slurm.cgroup.constrain_ram_space", (Unknown, Critical)),
        ("slurm.cgroup.allowed_ram_space", (Unknown, Warning)),
        ("slurm.cgroup.constrain_swap_space", (Unknown, Info)),
        ("slurm.cgroup.constrain_cores", (Unknown, Critical)),
        ("slurm.gres.gpu_files", (OK, Warning)),
    ] {
        assert_eq!(st(&r, id), want, "{id}:\n{text}");
    }
    assert_eq!(r.get("slurm.priority_decay_half_life").unwrap().found, "7-00:00:00");
    assert_eq!(r.get("slurm.gres.gpu_files").unwrap().found, "localhost: 8 GPUs, 8 files");
    assert_eq!(r.get("slurm.gres.gpu_files").unwrap().source, "/etc/slurm/slurm.conf + /etc/slurm/gres.conf");
    assert_eq!(r.summary.exit_code, 2);
    // a cgroup.conf given by path is read on the Slurm host, and judged
    let cg = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(cg.path(), "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=yes\n").unwrap();
    let path = cg.path().to_str().unwrap();
    let r = onramp::doctor::run(&slurm, Some(path), "production", Err("no API".into()), &settings(None)).await.unwrap();
    for (id, want) in [
        ("slurm.cgroup.plugin", OK),
        ("slurm.cgroup.constrain_devices", OK),
        ("slurm.cgroup.constrain_cores", OK),
        ("slurm.cgroup.constrain_ram_space", Finding),
        ("slurm.cgroup.allowed_ram_space", OK),
        ("slurm.cgroup.constrain_swap_space", OK),
    ] {
        assert_eq!(st(&r, id).0, want, "{id}");
        assert_eq!(r.get(id).unwrap().source, path);
    }
    // ConstrainDevices=yes: the GPU files are critical now (and there)
    assert_eq!(st(&r, "slurm.gres.gpu_files"), (OK, Critical));
    // another cluster name than onramp's is critical
    let r = onramp::doctor::run(&slurm, None, "staging", Err("no API".into()), &settings(None)).await.unwrap();
    assert_eq!(st(&r, "slurm.cluster_name"), (Finding, Critical));
}

/// The command: `--json` with stable field names, the exit code by severity, the pods read
/// through a kubeconfig.
#[tokio::test]
async fn the_command_prints_json_and_exits_by_severity() {
    crate::slurm::cluster_up();
    let fake = FakeK8s::start().await;
    let root = tempfile::tempdir().unwrap();
    world(&fake, root.path(), true);
    let kc = root.path().join("kubeconfig");
    std::fs::write(&kc, format!("apiVersion: v1\nkind: Config\ncurrent-context: t\nclusters:\n- name: f\n  cluster:\n    server: {}\ncontexts:\n- name: t\n  context:\n    cluster: f\n    user: u\nusers:\n- name: u\n  user:\n    token: x\n", fake.url)).unwrap();
    let reg = root.path().join("tenants.yaml");
    std::fs::write(
        &reg,
        "tenants:\n- { name: foo, group: tenant-foo-users }\n- { name: bar, group: tenant-bar-users }\n",
    )
    .unwrap();
    let env: Vec<(String, String)> = [
        ("ONRAMP_SLURM_VIA", "local"),
        ("ONRAMP_SLURM_CLUSTER", "production"),
        ("ONRAMP_KUBECONFIG", kc.to_str().unwrap()),
        ("ONRAMP_TENANTS", reg.to_str().unwrap()),
        ("ONRAMP_SLURMD_NAMESPACE", "slurm"),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    let o = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        crate::cli::onramp(&["doctor", "--json"], &env)
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(2), "{stdout}\n{}", String::from_utf8_lossy(&o.stderr));
    let j: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(j["cluster"], "production");
    assert_eq!(j["summary"]["exit_code"], 2);
    for f in j["findings"].as_array().unwrap() {
        for k in ["id", "status", "severity", "setting", "found", "expected", "where", "consequence", "fix"] {
            assert!(f.get(k).is_some(), "{k} missing in {f}");
        }
    }
    let by_id = |id: &str| j["findings"].as_array().unwrap().iter().find(|f| f["id"] == id).cloned().unwrap();
    assert_eq!(by_id("pods.nslcd_ids.login.foo")["status"], "ok");
    assert_eq!(by_id("slurm.proctrack_type")["status"], "finding");
    assert_eq!(by_id("slurm.proctrack_type")["severity"], "critical");
    assert_eq!(by_id("pods.weka_mounts.login.bar")["where"], "pod tenant-bar/login-0: /proc/mounts");
}

/// Slurm not reachable: nothing can be judged, exit 3 with why; the text form names each item
/// with what was found, where, why and the fix.
#[test]
fn unreachable_slurm_exits_3_and_the_text_says_why_and_the_fix() {
    crate::slurm::cluster_up();
    let o = crate::cli::onramp(
        &["doctor"],
        &[("ONRAMP_SLURM_VIA", "local"), ("ONRAMP_SLURM_CLUSTER", "production"), ("PATH", "/nonexistent")],
    );
    assert_eq!(o.status.code(), Some(3), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("could not read the Slurm configuration"), "{o:?}");

    let o = crate::cli::onramp(&["doctor"], &[("ONRAMP_SLURM_VIA", "local"), ("ONRAMP_SLURM_CLUSTER", "production")]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("CRITICAL  ProctrackType: proctrack/linuxproc  [scontrol show config]"), "{text}");
    assert!(text.contains("fix:  ProctrackType=proctrack/cgroup"), "{text}");
    assert!(text.contains("UNKNOWN   ConstrainDevices: (not read)  [cgroup.conf]"), "{text}");
    assert!(text.contains("note: /etc/slurm/cgroup.conf is not readable"), "{text}");
    assert!(text.contains("skipped   same uid/gid scheme (nslcd.conf)  [each tenant's login pod]"), "{text}");
    assert!(text.ends_with("(exit 2)\n"), "{text}");
}

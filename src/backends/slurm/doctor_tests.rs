use super::*;

fn conf(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn good() -> BTreeMap<String, String> {
    conf(&[
        ("ClusterName", "production"),
        ("SLURM_VERSION", "22.05.8"),
        ("SLURM_CONF", "/etc/slurm/slurm.conf"),
        ("AccountingStorageEnforce", "associations,limits,qos,safe"),
        ("ProctrackType", "proctrack/cgroup"),
        ("TaskPlugin", "task/affinity,task/cgroup"),
        ("PrologFlags", "Alloc,Contain"),
        ("PriorityType", "priority/multifactor"),
        ("PriorityFlags", ""),
        ("JobAcctGatherType", "jobacct_gather/cgroup"),
    ])
}

const CGROUP: &str = "CgroupPlugin=autodetect\nConstrainRAMSpace=yes\nConstrainCores=yes\nConstrainDevices=yes\n";

fn status(r: &Report, setting: &str) -> Status {
    r.findings.iter().find(|f| f.setting == setting).unwrap().status
}

#[test]
fn a_good_cluster_passes_and_fair_tree_by_default_is_recognised() {
    let r = diagnose(&good(), Ok(("/etc/slurm/cgroup.conf", CGROUP)));
    assert!(r.ok, "{}", render(&r));
    assert!(r.findings.iter().all(|f| f.status == Status::Ok), "{}", render(&r));
    let fair = r.findings.iter().find(|f| f.setting == "PriorityFlags").unwrap();
    assert!(fair.note.as_deref().unwrap().contains("by default"));
}

#[test]
fn each_pitfall_is_reported_with_consequence_and_fix() {
    let mut c = good();
    c.insert("AccountingStorageEnforce".into(), "associations,limits".into());
    c.insert("PriorityFlags".into(), "NO_FAIR_TREE".into());
    c.insert("PrologFlags".into(), "".into());
    let r = diagnose(&c, Ok(("/etc/slurm/cgroup.conf", "ConstrainCores=yes\nConstrainRAMSpace=no\n")));
    assert!(!r.ok);
    for s in ["AccountingStorageEnforce", "PriorityFlags", "PrologFlags", "ConstrainRAMSpace", "ConstrainDevices"] {
        assert_eq!(status(&r, s), Status::Missing, "{s}");
    }
    assert_eq!(status(&r, "ConstrainCores"), Status::Ok);
    let e = r.findings.iter().find(|f| f.setting == "AccountingStorageEnforce").unwrap();
    assert!(e.consequence.contains("advisory only") && e.note.as_deref() == Some("lacks qos,safe"));
    let d = r.findings.iter().find(|f| f.setting == "ConstrainDevices").unwrap();
    assert!(d.consequence.contains("--gres=gpu:1") && d.fix.contains("ConstrainDevices=yes"));
    let text = render(&r);
    assert!(text.contains("MISSING  ConstrainDevices") && text.contains("5 must-have(s) missing"), "{text}");
}

#[test]
fn safe_implies_limits_and_associations() {
    let mut c = good();
    c.insert("AccountingStorageEnforce".into(), "qos,safe".into());
    assert_eq!(status(&diagnose(&c, Ok(("x", CGROUP))), "AccountingStorageEnforce"), Status::Ok);
}

#[test]
fn fair_tree_must_be_explicit_before_19_05_and_needs_multifactor() {
    let mut c = good();
    c.insert("SLURM_VERSION".into(), "18.08.9".into());
    assert_eq!(status(&diagnose(&c, Ok(("x", CGROUP))), "PriorityFlags"), Status::Missing);
    c.insert("PriorityFlags".into(), "FAIR_TREE".into());
    assert_eq!(status(&diagnose(&c, Ok(("x", CGROUP))), "PriorityFlags"), Status::Ok);
    c.insert("PriorityType".into(), "priority/basic".into());
    assert_eq!(status(&diagnose(&c, Ok(("x", CGROUP))), "PriorityFlags"), Status::Missing);
}

#[test]
fn an_unreadable_cgroup_conf_is_unknown_not_failed_and_the_advice_is_not_required() {
    let mut c = good();
    c.insert("JobAcctGatherType".into(), "jobacct_gather/linux".into());
    let r = diagnose(&c, Err("/etc/slurm/cgroup.conf is not readable".into()));
    assert!(r.ok, "{}", render(&r));
    assert_eq!(status(&r, "ConstrainDevices"), Status::Unknown);
    assert_eq!(status(&r, "JobAcctGatherType"), Status::Missing);
    // scontrol prints the cgroup settings itself when a cgroup plugin is loaded.
    c.insert("ConstrainDevices".into(), "no".into());
    assert_eq!(status(&diagnose(&c, Err("x".into())), "ConstrainDevices"), Status::Missing);
}

#[test]
fn cgroup_conf_sits_beside_slurm_conf() {
    assert_eq!(cgroup_path(&good()), "/etc/slurm/cgroup.conf");
    assert_eq!(cgroup_path(&conf(&[("SLURM_CONF", "/opt/s/etc/slurm.conf")])), "/opt/s/etc/cgroup.conf");
}

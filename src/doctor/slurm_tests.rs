use super::*;
use crate::doctor::{Report, render};

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
        ("PriorityDecayHalfLife", "14-00:00:00"),
        ("JobAcctGatherType", "jobacct_gather/cgroup"),
    ])
}

const CGROUP: &str = "CgroupPlugin=autodetect\nConstrainRAMSpace=yes\nAllowedRAMSpace=100\nConstrainSwapSpace=no\nAllowedSwapSpace=0\nConstrainCores=yes\nConstrainDevices=yes\n";
const SLURM_CONF: &str = "NodeName=n[1-2] CPUs=8 Gres=gpu:8\n";
const GRES: &str = "Name=gpu File=/dev/nvidia[0-7]\n";

fn inputs(config: BTreeMap<String, String>, cgroup: Result<&str, &str>) -> Inputs {
    Inputs {
        config,
        slurm_conf: Ok(("/etc/slurm/slurm.conf".into(), SLURM_CONF.into())),
        cgroup_conf: cgroup.map(|t| ("/etc/slurm/cgroup.conf".to_string(), t.to_string())).map_err(str::to_string),
        gres_conf: Ok(("/etc/slurm/gres.conf".into(), GRES.into())),
    }
}

fn report(i: &Inputs) -> Report {
    Report::new("production".into(), "22.05.8".into(), diagnose(i))
}

fn status(r: &Report, id: &str) -> Status {
    r.get(id).unwrap_or_else(|| panic!("no {id}")).status
}

#[test]
fn a_good_cluster_passes_and_fair_tree_by_default_is_recognised() {
    let r = report(&inputs(good(), Ok(CGROUP)));
    assert_eq!(r.summary.exit_code, 0, "{}", render::text(&r));
    assert!(r.findings.iter().all(|f| f.status == Status::Ok), "{}", render::text(&r));
    assert!(r.get("slurm.fair_tree").unwrap().note.as_deref().unwrap().contains("by default"));
}

#[test]
fn each_pitfall_is_reported_with_consequence_and_fix() {
    let mut c = good();
    c.insert("AccountingStorageEnforce".into(), "associations,limits".into());
    c.insert("PriorityFlags".into(), "NO_FAIR_TREE".into());
    c.insert("PrologFlags".into(), "".into());
    c.insert("PriorityDecayHalfLife".into(), "7-00:00:00".into());
    let cg = "ConstrainCores=yes\nConstrainRAMSpace=no\nAllowedRAMSpace=120\nConstrainSwapSpace=yes\nCgroupPlugin=disabled\n";
    let r = report(&inputs(c, Ok(cg)));
    for id in [
        "slurm.accounting_storage_enforce",
        "slurm.fair_tree",
        "slurm.prolog_flags",
        "slurm.cgroup.constrain_ram_space",
        "slurm.cgroup.constrain_devices",
        "slurm.cgroup.plugin",
        "slurm.cgroup.allowed_ram_space",
        "slurm.cgroup.constrain_swap_space",
        "slurm.priority_decay_half_life",
    ] {
        assert_eq!(status(&r, id), Status::Finding, "{id}");
    }
    assert_eq!(status(&r, "slurm.cgroup.constrain_cores"), Status::Ok);
    // ConstrainDevices is off: a missing File= is a warning then, and here there is none missing
    assert_eq!(r.get("slurm.gres.gpu_files").unwrap().severity, Severity::Warning);
    let e = r.get("slurm.accounting_storage_enforce").unwrap();
    assert!(e.consequence.contains("advisory only") && e.note.as_deref() == Some("lacks qos,safe"));
    let d = r.get("slurm.cgroup.constrain_devices").unwrap();
    assert!(d.consequence.contains("--gres=gpu:1") && d.fix.contains("ConstrainDevices=yes"));
    assert_eq!(d.note.as_deref(), Some("not set: Slurm's default is no"));
    assert_eq!((r.summary.critical, r.summary.warning, r.summary.info), (6, 2, 1), "{}", render::text(&r));
    assert_eq!(r.summary.exit_code, 2);
    let text = render::text(&r);
    assert!(text.contains("CRITICAL  ConstrainDevices") && text.contains("6 critical"), "{text}");
}

#[test]
fn safe_implies_limits_and_associations() {
    let mut c = good();
    c.insert("AccountingStorageEnforce".into(), "qos,safe".into());
    assert_eq!(status(&report(&inputs(c, Ok(CGROUP))), "slurm.accounting_storage_enforce"), Status::Ok);
}

#[test]
fn fair_tree_must_be_explicit_before_19_05_and_needs_multifactor() {
    let mut c = good();
    c.insert("SLURM_VERSION".into(), "18.08.9".into());
    assert_eq!(status(&report(&inputs(c.clone(), Ok(CGROUP))), "slurm.fair_tree"), Status::Finding);
    c.insert("PriorityFlags".into(), "FAIR_TREE".into());
    assert_eq!(status(&report(&inputs(c.clone(), Ok(CGROUP))), "slurm.fair_tree"), Status::Ok);
    c.insert("PriorityType".into(), "priority/basic".into());
    assert_eq!(status(&report(&inputs(c, Ok(CGROUP))), "slurm.fair_tree"), Status::Finding);
}

#[test]
fn an_unreadable_cgroup_conf_is_unknown_and_warnings_alone_exit_1() {
    let mut c = good();
    c.insert("JobAcctGatherType".into(), "jobacct_gather/linux".into());
    let r = report(&inputs(c.clone(), Err("/etc/slurm/cgroup.conf is not readable")));
    assert_eq!(status(&r, "slurm.cgroup.constrain_devices"), Status::Unknown);
    assert_eq!(status(&r, "slurm.job_acct_gather_type"), Status::Finding);
    assert_eq!(r.summary.exit_code, 3, "{}", render::text(&r));
    assert_eq!(report(&inputs(c.clone(), Ok(CGROUP))).summary.exit_code, 1);
    // scontrol prints the cgroup settings itself when a cgroup plugin is loaded.
    c.insert("ConstrainDevices".into(), "no".into());
    let r = report(&inputs(c, Err("x")));
    assert_eq!(status(&r, "slurm.cgroup.constrain_devices"), Status::Finding);
    assert_eq!(r.summary.exit_code, 2);
}

#[test]
fn durations_and_files_beside_slurm_conf() {
    assert_eq!(minutes("14-0"), Some(14 * 1440));
    assert_eq!(minutes("7-00:00:00"), Some(7 * 1440));
    assert_eq!(minutes("00:05:00"), Some(5));
    assert_eq!(minutes("0"), Some(0));
    assert_eq!(beside_slurm_conf(&good(), "cgroup.conf"), "/etc/slurm/cgroup.conf");
    assert_eq!(
        beside_slurm_conf(&conf(&[("SLURM_CONF", "/opt/s/etc/slurm.conf")]), "gres.conf"),
        "/opt/s/etc/gres.conf"
    );
}

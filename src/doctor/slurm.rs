//! The Slurm items: `scontrol show config` and the files beside slurm.conf (cgroup.conf,
//! gres.conf, slurm.conf itself for the nodes' `Gres=`), all read on the Slurm host through the
//! Slurm route (`Slurm::config`, `Slurm::read_file`), never from this machine's file system
//! unless the route is local.

use std::collections::BTreeMap;

use super::{Finding, Severity, Status, conf_get, gres};
use crate::backends::slurm::{HostPath, Slurm, SlurmError};

const SCONTROL: &str = "scontrol show config";

/// A file read on the Slurm host: its path and text, or why it could not be read.
pub type Read = Result<(String, String), String>;

/// What the Slurm checks read.
pub struct Inputs {
    pub config: BTreeMap<String, String>,
    pub slurm_conf: Read,
    pub cgroup_conf: Read,
    pub gres_conf: Read,
}

fn flags(v: &str) -> Vec<String> {
    v.split(',').map(|f| f.trim().to_ascii_lowercase()).filter(|f| !f.is_empty()).collect()
}

/// (major, minor) of "22.05.8".
fn version(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

/// Minutes of a Slurm duration as `scontrol` prints it (`7-00:00:00`, `14-0`, `00:05:00`, `0`).
pub fn minutes(v: &str) -> Option<u64> {
    let (days, rest) = match v.split_once('-') {
        Some((d, r)) => (d.trim().parse::<u64>().ok()?, r),
        None => (0, v),
    };
    let parts: Vec<u64> = rest.split(':').map(|p| p.trim().parse().ok()).collect::<Option<_>>()?;
    let m = match (v.contains('-'), parts.as_slice()) {
        (true, [h]) => h * 60,
        (true, [h, m]) => h * 60 + m,
        (true, [h, m, _]) => h * 60 + m,
        (false, [m]) => *m,
        (false, [m, _]) => *m,
        (false, [h, m, _]) => h * 60 + m,
        _ => return None,
    };
    Some(days * 24 * 60 + m)
}

/// The file `name` beside slurm.conf.
pub fn beside_slurm_conf(config: &BTreeMap<String, String>, name: &str) -> String {
    let conf = config.get("SLURM_CONF").map(String::as_str).unwrap_or("/etc/slurm/slurm.conf");
    match conf.rsplit_once('/') {
        Some((dir, _)) if !dir.is_empty() => format!("{dir}/{name}"),
        _ => format!("/etc/slurm/{name}"),
    }
}

async fn read(slurm: &dyn Slurm, path: &str) -> Result<Read, SlurmError> {
    let p = HostPath::parse(path).map_err(|e| SlurmError::Invalid(e.to_string()))?;
    Ok(slurm.read_file(&p).await?.map(|t| (path.to_string(), t)).ok_or_else(|| format!("{path} is not readable")))
}

/// Reads the configuration through the Slurm route. `cgroup_conf`: its path on the Slurm host
/// [default: beside slurm.conf].
pub async fn read_inputs(slurm: &dyn Slurm, cgroup_conf: Option<&str>) -> Result<Inputs, SlurmError> {
    let config = slurm.config().await?;
    let slurm_path = config.get("SLURM_CONF").cloned().unwrap_or_else(|| "/etc/slurm/slurm.conf".into());
    let cgroup_path = cgroup_conf.map(str::to_string).unwrap_or_else(|| beside_slurm_conf(&config, "cgroup.conf"));
    let gres_path = beside_slurm_conf(&config, "gres.conf");
    let slurm_conf = read(slurm, &slurm_path).await?;
    let cgroup_conf = read(slurm, &cgroup_path).await?;
    let gres_conf = read(slurm, &gres_path).await?;
    Ok(Inputs { config, slurm_conf, cgroup_conf, gres_conf })
}

/// Every Slurm check over what was read.
pub fn diagnose(i: &Inputs) -> Vec<Finding> {
    let config = &i.config;
    let get = |k: &str| config.get(k).cloned().unwrap_or_default();
    let slurm_version = get("SLURM_VERSION");
    let mut out = vec![];

    let enforce = get("AccountingStorageEnforce");
    let mut have = flags(&enforce);
    if have.iter().any(|f| f == "safe") {
        have.extend(["limits".to_string(), "associations".to_string()]); // safe implies both
    }
    if have.iter().any(|f| f == "limits") {
        have.push("associations".into());
    }
    let lacking: Vec<&str> =
        ["associations", "limits", "qos", "safe"].into_iter().filter(|f| !have.iter().any(|h| h == f)).collect();
    out.push(
        Finding::new("slurm.accounting_storage_enforce", Severity::Critical, "AccountingStorageEnforce")
            .ok_if(lacking.is_empty())
            .found(&enforce)
            .expected("associations,limits,qos,safe")
            .at(SCONTROL)
            .note_opt((!lacking.is_empty()).then(|| format!("lacks {}", lacking.join(","))))
            .why("A tenant's QoS limits aren't enforced: without qos, QoS limits are advisory only; without associations and limits, users outside the account tree can run and association limits (GrpTRES, MaxJobs, blocks) do nothing.")
            .fix("AccountingStorageEnforce=associations,limits,qos,safe in slurm.conf, then restart slurmctld."),
    );
    let proctrack = get("ProctrackType");
    out.push(
        Finding::new("slurm.proctrack_type", Severity::Critical, "ProctrackType")
            .ok_if(proctrack == "proctrack/cgroup")
            .found(&proctrack)
            .expected("proctrack/cgroup")
            .at(SCONTROL)
            .why("A tenant escapes their cgroup: without cgroup process tracking Slurm can't actually constrain CPU/memory/GPU.")
            .fix("ProctrackType=proctrack/cgroup in slurm.conf (with a cgroup.conf), then restart slurmctld and slurmd."),
    );
    let task = get("TaskPlugin");
    out.push(
        Finding::new("slurm.task_plugin", Severity::Critical, "TaskPlugin")
            .ok_if(flags(&task).iter().any(|f| f == "task/cgroup"))
            .found(&task)
            .expected("task/cgroup (e.g. task/affinity,task/cgroup)")
            .at(SCONTROL)
            .why("A tenant escapes their cgroup: without task/cgroup Slurm can't actually constrain CPU/memory/GPU of the tasks.")
            .fix("TaskPlugin=task/affinity,task/cgroup in slurm.conf, then restart slurmd."),
    );
    let prolog = get("PrologFlags");
    out.push(
        Finding::new("slurm.prolog_flags", Severity::Critical, "PrologFlags")
            .ok_if(flags(&prolog).iter().any(|f| f == "contain"))
            .found(&prolog)
            .expected("Contain")
            .at(SCONTROL)
            .why("The cgroup is created at first task launch, not at prolog — that races, and processes started before it escape.")
            .fix("PrologFlags=Contain in slurm.conf."),
    );

    let (ptype, pflags) = (get("PriorityType"), flags(&get("PriorityFlags")));
    let default_on = version(&slurm_version).is_some_and(|v| v >= (19, 5));
    let fair = pflags.iter().any(|f| f == "fair_tree") || (default_on && !pflags.iter().any(|f| f == "no_fair_tree"));
    let note = (default_on && fair && !pflags.iter().any(|f| f == "fair_tree")).then(|| {
        format!("Slurm {slurm_version} uses the fair tree by default and shows PriorityFlags without FAIR_TREE; no NO_FAIR_TREE is set")
    });
    out.push(
        Finding::new("slurm.fair_tree", Severity::Critical, "PriorityFlags")
            .ok_if(ptype == "priority/multifactor" && fair)
            .found(format!("PriorityType={ptype} PriorityFlags={}", get("PriorityFlags")))
            .expected("FAIR_TREE with PriorityType=priority/multifactor")
            .at(SCONTROL)
            .note_opt(note)
            .why("User has wrong fair-share: it does not roll up the account tree, so a tenant's share is not the sum of its teams and one tenant can be starved by another's activity.")
            .fix("PriorityType=priority/multifactor and PriorityFlags=FAIR_TREE (the default since Slurm 19.05: remove NO_FAIR_TREE)."),
    );
    let half = get("PriorityDecayHalfLife");
    let m = minutes(&half);
    out.push(
        Finding::new("slurm.priority_decay_half_life", Severity::Warning, "PriorityDecayHalfLife")
            .ok_if(m == Some(14 * 24 * 60))
            .found(&half)
            .expected("14-0 (14 days)")
            .at(SCONTROL)
            .note_opt(match m {
                Some(0) => Some("0 turns decay off: usage never decays, so GrpTRESMins is a lifetime cap".into()),
                None if !half.is_empty() => Some(format!("{half:?} is not a duration doctor reads")),
                _ => None,
            })
            .why("GPU-minute budgets (GrpTRESMins) and fair-share decay at another rate than the runbook plans: with 14-0 usage decays back over 14 days, a soft cap on rate-of-spend; a user with wrong fair-share waits one decay half-life.")
            .fix("PriorityDecayHalfLife=14-0 in slurm.conf, then scontrol reconfigure."),
    );
    let gather = get("JobAcctGatherType");
    out.push(
        Finding::new("slurm.job_acct_gather_type", Severity::Warning, "JobAcctGatherType")
            .ok_if(gather == "jobacct_gather/cgroup")
            .found(&gather)
            .expected("jobacct_gather/cgroup")
            .at(SCONTROL)
            .why("Resource accounting walks /proc instead of coming from the cgroup itself (less accurate usage and billing).")
            .fix("JobAcctGatherType=jobacct_gather/cgroup in slurm.conf."),
    );
    out.extend(cgroup(i));
    let devices = out.iter().find(|f| f.id == "slurm.cgroup.constrain_devices").map(|f| f.status == Status::Ok);
    out.push(gres::check(&i.slurm_conf, &i.gres_conf, devices));
    out
}

/// A cgroup.conf setting: from `scontrol show config` when it prints it (22.05 does when a cgroup
/// plugin is loaded), else from cgroup.conf; `default` when neither sets it.
fn cgroup_value(i: &Inputs, key: &str, default: &str) -> Result<(String, String, Option<String>), String> {
    if let Some(v) = i.config.get(key) {
        return Ok((v.clone(), SCONTROL.into(), None));
    }
    let (path, text) = i.cgroup_conf.as_ref().map_err(Clone::clone)?;
    Ok(match conf_get(text, key) {
        Some(v) => (v, path.clone(), None),
        None => (default.to_string(), path.clone(), Some(format!("not set: Slurm's default is {default}"))),
    })
}

/// A cgroup.conf must-have: its id (under `slurm.cgroup.`), Slurm's default and the test.
struct CgroupCheck {
    id: &'static str,
    severity: Severity,
    setting: &'static str,
    default: &'static str,
    expected: &'static str,
    ok: fn(&str) -> bool,
    why: &'static str,
    fix: &'static str,
}

fn yes(v: &str) -> bool {
    v.eq_ignore_ascii_case("yes")
}

fn cgroup(i: &Inputs) -> Vec<Finding> {
    let checks = [
        CgroupCheck {
            id: "plugin",
            severity: Severity::Critical,
            setting: "CgroupPlugin",
            default: "autodetect",
            expected: "autodetect (or cgroup/v1, cgroup/v2)",
            ok: |v| ["autodetect", "cgroup/v1", "cgroup/v2"].contains(&v.to_ascii_lowercase().as_str()),
            why: "A tenant escapes their cgroup: without a cgroup plugin nothing constrains CPU, memory or GPUs.",
            fix: "CgroupPlugin=autodetect in cgroup.conf, then restart slurmd.",
        },
        CgroupCheck {
            id: "constrain_devices",
            severity: Severity::Critical,
            setting: "ConstrainDevices",
            default: "no",
            expected: "yes",
            ok: yes,
            why: "A user with --gres=gpu:1 can nvidia-smi (or worse, run on) all GPUs on the node — billed for 1, with access to all.",
            fix: "ConstrainDevices=yes in cgroup.conf (and gres.conf File= lines for the GPUs).",
        },
        CgroupCheck {
            id: "constrain_ram_space",
            severity: Severity::Critical,
            setting: "ConstrainRAMSpace",
            default: "no",
            expected: "yes",
            ok: yes,
            why: "Jobs are not held to their allocated memory: Slurm can't actually constrain memory, so one tenant's job can take another's.",
            fix: "ConstrainRAMSpace=yes (with AllowedRAMSpace=100) in cgroup.conf.",
        },
        CgroupCheck {
            id: "constrain_cores",
            severity: Severity::Critical,
            setting: "ConstrainCores",
            default: "no",
            expected: "yes",
            ok: yes,
            why: "Jobs are not pinned to their allocated cores: Slurm can't actually constrain CPU.",
            fix: "ConstrainCores=yes in cgroup.conf.",
        },
        CgroupCheck {
            id: "allowed_ram_space",
            severity: Severity::Warning,
            setting: "AllowedRAMSpace",
            default: "100",
            expected: "100",
            ok: |v| v.trim() == "100",
            why: "The memory hard limit is AllocatedMemory * AllowedRAMSpace/100: above 100 a job takes memory it was not allocated (another tenant's), below 100 jobs are killed under their allocation.",
            fix: "AllowedRAMSpace=100 in cgroup.conf.",
        },
    ];
    let mut out = vec![];
    for c in checks {
        let f = Finding::new(&format!("slurm.cgroup.{}", c.id), c.severity, c.setting)
            .expected(c.expected)
            .why(c.why)
            .fix(c.fix);
        out.push(match cgroup_value(i, c.setting, c.default) {
            Ok((v, at, note)) => f.ok_if((c.ok)(&v)).found(v).at(at).note_opt(note),
            Err(why) => f.status(Status::Unknown).at("cgroup.conf").note(why),
        });
    }
    // The runbook leaves swap unconstrained (ConstrainSwapSpace=no, AllowedSwapSpace=0):
    // containers shouldn't swap. Constraining it is stricter, not a hole: information only.
    let f = Finding::new("slurm.cgroup.constrain_swap_space", Severity::Info, "ConstrainSwapSpace")
        .expected("no (with AllowedSwapSpace=0)")
        .why("With ConstrainSwapSpace=yes a job that touches swap is killed at AllocatedMemory*(AllowedRAMSpace+AllowedSwapSpace)/100, which the runbook does not plan for (containers shouldn't be swapping anyway).")
        .fix("ConstrainSwapSpace=no and AllowedSwapSpace=0 in cgroup.conf, as the runbook has it (or keep yes deliberately).");
    out.push(match cgroup_value(i, "ConstrainSwapSpace", "no") {
        Ok((v, at, note)) => f.ok_if(!yes(&v)).found(v).at(at).note_opt(note),
        Err(why) => f.status(Status::Unknown).at("cgroup.conf").note(why),
    });
    out
}

#[cfg(test)]
#[path = "slurm_tests.rs"]
mod tests;

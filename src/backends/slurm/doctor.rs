//! `onramp doctor`: the cluster's configuration against the runbook's multi-tenancy pitfalls.
//! Each finding says what was found, what the runbook says happens without it, and the fix.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{HostPath, Slurm, SlurmError, parse};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Ok,
    Missing,
    /// Could not be checked (cgroup.conf not readable).
    Unknown,
}

#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    pub setting: &'static str,
    /// Where it was read: `scontrol show config` or the cgroup.conf path.
    pub source: String,
    pub status: Status,
    /// A must-have: missing it makes doctor fail.
    pub required: bool,
    pub found: String,
    pub expected: &'static str,
    pub consequence: &'static str,
    pub fix: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub cluster: String,
    pub slurm_version: String,
    pub findings: Vec<Finding>,
    /// No must-have is missing.
    pub ok: bool,
}

fn flags(v: &str) -> Vec<String> {
    v.split(',').map(|f| f.trim().to_ascii_lowercase()).filter(|f| !f.is_empty()).collect()
}

/// (major, minor) of "22.05.8".
fn version(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split('.');
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

struct Check {
    setting: &'static str,
    expected: &'static str,
    required: bool,
    consequence: &'static str,
    fix: &'static str,
}

const ENFORCE: Check = Check {
    setting: "AccountingStorageEnforce",
    expected: "associations,limits,qos,safe",
    required: true,
    consequence: "A tenant's QoS limits aren't enforced: without qos, QoS limits are advisory only; without associations and limits, users outside the account tree can run and association limits (GrpTRES, MaxJobs, blocks) do nothing.",
    fix: "AccountingStorageEnforce=associations,limits,qos,safe in slurm.conf, then restart slurmctld.",
};
const PROCTRACK: Check = Check {
    setting: "ProctrackType",
    expected: "proctrack/cgroup",
    required: true,
    consequence: "A tenant escapes their cgroup: without cgroup process tracking Slurm can't actually constrain CPU/memory/GPU.",
    fix: "ProctrackType=proctrack/cgroup in slurm.conf (with a cgroup.conf), then restart slurmctld and slurmd.",
};
const TASK: Check = Check {
    setting: "TaskPlugin",
    expected: "task/cgroup (e.g. task/affinity,task/cgroup)",
    required: true,
    consequence: "A tenant escapes their cgroup: without task/cgroup Slurm can't actually constrain CPU/memory/GPU of the tasks.",
    fix: "TaskPlugin=task/affinity,task/cgroup in slurm.conf, then restart slurmd.",
};
const PROLOG: Check = Check {
    setting: "PrologFlags",
    expected: "Contain",
    required: true,
    consequence: "The cgroup is created at first task launch, not at prolog — that races, and processes started before it escape.",
    fix: "PrologFlags=Contain in slurm.conf.",
};
const FAIR_TREE: Check = Check {
    setting: "PriorityFlags",
    expected: "FAIR_TREE with PriorityType=priority/multifactor",
    required: true,
    consequence: "Fair-share does not roll up the account tree: a tenant's share is not the sum of its teams, so one tenant can be starved by another's activity.",
    fix: "PriorityType=priority/multifactor and PriorityFlags=FAIR_TREE (the default since Slurm 19.05: remove NO_FAIR_TREE).",
};
const ACCT_GATHER: Check = Check {
    setting: "JobAcctGatherType",
    expected: "jobacct_gather/cgroup",
    required: false,
    consequence: "Resource accounting walks /proc instead of coming from the cgroup itself (less accurate usage and billing).",
    fix: "JobAcctGatherType=jobacct_gather/cgroup in slurm.conf.",
};
const DEVICES: Check = Check {
    setting: "ConstrainDevices",
    expected: "yes",
    required: true,
    consequence: "A user with --gres=gpu:1 can nvidia-smi (or worse, run on) all GPUs on the node — billed for 1, with access to all.",
    fix: "ConstrainDevices=yes in cgroup.conf (and gres.conf File= lines for the GPUs).",
};
const RAM: Check = Check {
    setting: "ConstrainRAMSpace",
    expected: "yes",
    required: true,
    consequence: "Jobs are not held to their allocated memory: Slurm can't actually constrain memory, so one tenant's job can take another's.",
    fix: "ConstrainRAMSpace=yes (with AllowedRAMSpace=100) in cgroup.conf.",
};
const CORES: Check = Check {
    setting: "ConstrainCores",
    expected: "yes",
    required: true,
    consequence: "Jobs are not pinned to their allocated cores: Slurm can't actually constrain CPU.",
    fix: "ConstrainCores=yes in cgroup.conf.",
};

fn finding(c: &Check, source: &str, ok: Option<bool>, found: &str, note: Option<String>) -> Finding {
    Finding {
        setting: c.setting,
        source: source.to_string(),
        status: match ok {
            Some(true) => Status::Ok,
            Some(false) => Status::Missing,
            None => Status::Unknown,
        },
        required: c.required,
        found: found.to_string(),
        expected: c.expected,
        consequence: c.consequence,
        fix: c.fix,
        note,
    }
}

/// Checks `scontrol show config` (as key/value pairs) and, when given, cgroup.conf (its path and
/// text). `None` for cgroup.conf marks its items unknown (unless scontrol printed them).
pub fn diagnose(config: &BTreeMap<String, String>, cgroup: Result<(&str, &str), String>) -> Report {
    const SCONTROL: &str = "scontrol show config";
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
    let note = (!lacking.is_empty()).then(|| format!("lacks {}", lacking.join(",")));
    out.push(finding(&ENFORCE, SCONTROL, Some(lacking.is_empty()), &enforce, note));

    let proctrack = get("ProctrackType");
    out.push(finding(&PROCTRACK, SCONTROL, Some(proctrack == "proctrack/cgroup"), &proctrack, None));
    let task = get("TaskPlugin");
    out.push(finding(&TASK, SCONTROL, Some(flags(&task).iter().any(|f| f == "task/cgroup")), &task, None));
    let prolog = get("PrologFlags");
    out.push(finding(&PROLOG, SCONTROL, Some(flags(&prolog).iter().any(|f| f == "contain")), &prolog, None));

    let (ptype, pflags) = (get("PriorityType"), flags(&get("PriorityFlags")));
    let default_on = version(&slurm_version).is_some_and(|v| v >= (19, 5));
    let fair = pflags.iter().any(|f| f == "fair_tree") || (default_on && !pflags.iter().any(|f| f == "no_fair_tree"));
    let ok = ptype == "priority/multifactor" && fair;
    let note = (default_on && fair && !pflags.iter().any(|f| f == "fair_tree")).then(|| {
        format!("Slurm {slurm_version} uses the fair tree by default and shows PriorityFlags without FAIR_TREE; no NO_FAIR_TREE is set")
    });
    let found = format!("PriorityType={ptype} PriorityFlags={}", get("PriorityFlags"));
    out.push(finding(&FAIR_TREE, SCONTROL, Some(ok), &found, note));

    let gather = get("JobAcctGatherType");
    out.push(finding(&ACCT_GATHER, SCONTROL, Some(gather == "jobacct_gather/cgroup"), &gather, None));

    let cg = cgroup.as_ref().map(|(path, text)| (path.to_string(), parse::cgroup_conf(text)));
    for c in [&DEVICES, &RAM, &CORES] {
        // 22.05 prints cgroup.conf in `scontrol show config` when a cgroup plugin is loaded.
        if let Some(v) = config.get(c.setting) {
            out.push(finding(c, SCONTROL, Some(v.eq_ignore_ascii_case("yes")), v, None));
            continue;
        }
        match &cg {
            Ok((path, map)) => {
                let v = map.get(&c.setting.to_ascii_lowercase()).cloned().unwrap_or_default();
                let note = v.is_empty().then(|| "not set (Slurm's default is no)".to_string());
                out.push(finding(c, path, Some(v.eq_ignore_ascii_case("yes")), &v, note));
            }
            Err(why) => out.push(finding(c, "cgroup.conf", None, "", Some(why.to_string()))),
        }
    }
    let ok = !out.iter().any(|f| f.required && f.status == Status::Missing);
    Report { cluster: get("ClusterName"), slurm_version, findings: out, ok }
}

/// cgroup.conf beside slurm.conf, unless a path is given.
pub fn cgroup_path(config: &BTreeMap<String, String>) -> String {
    let conf = config.get("SLURM_CONF").map(String::as_str).unwrap_or("/etc/slurm/slurm.conf");
    match conf.rsplit_once('/') {
        Some((dir, _)) if !dir.is_empty() => format!("{dir}/cgroup.conf"),
        _ => "/etc/slurm/cgroup.conf".into(),
    }
}

/// Reads the configuration through the backend and diagnoses it.
pub async fn doctor(slurm: &dyn Slurm, cgroup_conf: Option<HostPath>) -> Result<Report, SlurmError> {
    let config = slurm.config().await?;
    let path = match cgroup_conf {
        Some(p) => p,
        None => HostPath::parse(&cgroup_path(&config)).map_err(|e| SlurmError::Invalid(e.to_string()))?,
    };
    let text = slurm.read_file(&path).await?;
    let cgroup =
        text.as_deref().map(|t| (path.as_str(), t)).ok_or_else(|| format!("{} is not readable", path.as_str()));
    Ok(diagnose(&config, cgroup))
}

/// For people: one line per finding, with consequence and fix for what is missing.
pub fn render(r: &Report) -> String {
    let mut s = format!("cluster {}, Slurm {}\n", r.cluster, r.slurm_version);
    for f in &r.findings {
        let tag = match (f.status, f.required) {
            (Status::Ok, _) => "ok     ",
            (Status::Missing, true) => "MISSING",
            (Status::Missing, false) => "advised",
            (Status::Unknown, _) => "unknown",
        };
        let found = if f.found.is_empty() { "(not set)" } else { &f.found };
        s.push_str(&format!("{tag}  {}: {found}  [{}]\n", f.setting, f.source));
        if let Some(n) = &f.note {
            s.push_str(&format!("         note: {n}\n"));
        }
        if f.status != Status::Ok {
            s.push_str(&format!(
                "         want: {}\n         why:  {}\n         fix:  {}\n",
                f.expected, f.consequence, f.fix
            ));
        }
    }
    let missing = r.findings.iter().filter(|f| f.required && f.status == Status::Missing).count();
    s.push_str(&if missing == 0 {
        "no must-have is missing\n".to_string()
    } else {
        format!("{missing} must-have(s) missing\n")
    });
    s
}

#[cfg(test)]
#[path = "doctor_tests.rs"]
mod tests;

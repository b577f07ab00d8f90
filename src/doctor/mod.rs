//! `onramp doctor`: the cluster against every failure mode the runbook names. Checks are data:
//! each [`Finding`] has an id, a severity, what was found and where it was read, what goes wrong
//! (in the runbook's words) and the fix.
//!
//! - [`slurm`]: slurm.conf (through `scontrol show config`), cgroup.conf and gres.conf, read on
//!   the Slurm host through the Slurm route;
//! - [`gres`]: the GPU GRES of the nodes against gres.conf's `File=` lines;
//! - [`pods`]: the login and slurmd pods through the Kubernetes API (specs, mounted Secrets, and
//!   files read by exec: nslcd.conf, PAM, the mount table);
//! - [`render`]: the report for people.

pub mod gres;
pub mod k8s;
pub mod pods;
pub mod render;
pub mod slurm;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    Info,
    Warning,
    Critical,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// As the runbook wants it.
    Ok,
    /// Not as the runbook wants it: `severity` says how bad.
    Finding,
    /// Tried, but could not be read (a file not readable, an exec that failed).
    Unknown,
    /// Not attempted: what it needs is not configured (`note` says what).
    NotChecked,
}

/// One check's result. The JSON field names are stable (monitoring reads them).
#[derive(Clone, Debug, Serialize)]
pub struct Finding {
    /// Stable identifier, e.g. `slurm.cgroup.constrain_devices`, `pods.nslcd.uid_gid_scheme`.
    pub id: String,
    pub status: Status,
    /// How bad a `finding` of this check is.
    pub severity: Severity,
    /// The setting or thing checked, as the runbook names it.
    pub setting: String,
    /// What was found (empty: not set / not present).
    pub found: String,
    /// What the runbook wants.
    pub expected: String,
    /// Where it was read: `scontrol show config`, a file path, `pod ns/name: /etc/nslcd.conf`.
    #[serde(rename = "where")]
    pub source: String,
    /// What goes wrong without it.
    pub consequence: String,
    pub fix: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Finding {
    pub fn new(id: &str, severity: Severity, setting: &str) -> Self {
        Self {
            id: id.into(),
            status: Status::Unknown,
            severity,
            setting: setting.into(),
            found: String::new(),
            expected: String::new(),
            source: String::new(),
            consequence: String::new(),
            fix: String::new(),
            note: None,
        }
    }
    pub fn ok_if(mut self, ok: bool) -> Self {
        self.status = if ok { Status::Ok } else { Status::Finding };
        self
    }
    pub fn status(mut self, s: Status) -> Self {
        self.status = s;
        self
    }
    pub fn found(mut self, s: impl Into<String>) -> Self {
        self.found = s.into();
        self
    }
    pub fn expected(mut self, s: impl Into<String>) -> Self {
        self.expected = s.into();
        self
    }
    pub fn at(mut self, s: impl Into<String>) -> Self {
        self.source = s.into();
        self
    }
    pub fn why(mut self, s: impl Into<String>) -> Self {
        self.consequence = s.into();
        self
    }
    pub fn fix(mut self, s: impl Into<String>) -> Self {
        self.fix = s.into();
        self
    }
    pub fn note(mut self, s: impl Into<String>) -> Self {
        self.note = Some(s.into());
        self
    }
    pub fn note_opt(mut self, s: Option<String>) -> Self {
        self.note = s;
        self
    }
    /// A `finding` of severity critical.
    pub fn is_critical(&self) -> bool {
        self.status == Status::Finding && self.severity == Severity::Critical
    }
}

/// Exit codes, as `onramp doctor --help` documents them.
pub const EXIT_OK: u8 = 0;
pub const EXIT_WARNING: u8 = 1;
pub const EXIT_CRITICAL: u8 = 2;
pub const EXIT_UNKNOWN: u8 = 3;

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub cluster: String,
    pub slurm_version: String,
    pub findings: Vec<Finding>,
    pub summary: Summary,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Summary {
    pub ok: usize,
    pub critical: usize,
    pub warning: usize,
    pub info: usize,
    pub unknown: usize,
    pub not_checked: usize,
    /// The process's exit code: 2 a critical finding, else 3 something could not be checked,
    /// else 1 a warning, else 0.
    pub exit_code: u8,
}

impl Report {
    pub fn new(cluster: String, slurm_version: String, findings: Vec<Finding>) -> Self {
        let mut s = Summary::default();
        for f in &findings {
            match (f.status, f.severity) {
                (Status::Ok, _) => s.ok += 1,
                (Status::Finding, Severity::Critical) => s.critical += 1,
                (Status::Finding, Severity::Warning) => s.warning += 1,
                (Status::Finding, Severity::Info) => s.info += 1,
                (Status::Unknown, _) => s.unknown += 1,
                (Status::NotChecked, _) => s.not_checked += 1,
            }
        }
        s.exit_code = if s.critical > 0 {
            EXIT_CRITICAL
        } else if s.unknown > 0 {
            EXIT_UNKNOWN
        } else if s.warning > 0 {
            EXIT_WARNING
        } else {
            EXIT_OK
        };
        Self { cluster, slurm_version, findings, summary: s }
    }

    pub fn get(&self, id: &str) -> Option<&Finding> {
        self.findings.iter().find(|f| f.id == id)
    }
}

/// `key=value` settings of a Slurm-style configuration file (slurm.conf, cgroup.conf): keys
/// lower-cased, comments dropped, several pairs on a line allowed; the last one wins.
pub fn conf_pairs(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or(""))
        .flat_map(|l| l.split_whitespace().filter_map(|w| w.split_once('=')).collect::<Vec<_>>())
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect()
}

/// The last value of `key` (case-insensitive) in a Slurm-style configuration file.
pub fn conf_get(text: &str, key: &str) -> Option<String> {
    let key = key.to_ascii_lowercase();
    conf_pairs(text).into_iter().filter(|(k, _)| *k == key).map(|(_, v)| v).next_back()
}

/// Runs every check: the Slurm items through the Slurm route, the pod items through the
/// Kubernetes API when one is given (`Err(why)` otherwise). `Err` when Slurm cannot be read.
pub async fn run(
    slurm: &dyn crate::backends::slurm::Slurm,
    cgroup_conf: Option<&str>,
    expected_cluster: &str,
    k8s: Result<&crate::backends::kubernetes::K8s, String>,
    pods: &k8s::PodSettings,
) -> Result<Report, crate::backends::slurm::SlurmError> {
    let inputs = slurm::read_inputs(slurm, cgroup_conf).await?;
    let get = |k: &str| inputs.config.get(k).cloned().unwrap_or_default();
    let (cluster, version) = (get("ClusterName"), get("SLURM_VERSION"));
    let mut findings = vec![
        Finding::new("slurm.cluster_name", Severity::Critical, "ClusterName")
            .ok_if(cluster == expected_cluster)
            .found(&cluster)
            .expected(format!("{expected_cluster} (ONRAMP_SLURM_CLUSTER)"))
            .at("scontrol show config")
            .why("onramp would write accounts and associations to another cluster than the one it is set up for.")
            .fix("Point the Slurm route at the right slurmctld, or set ONRAMP_SLURM_CLUSTER to its ClusterName."),
    ];
    findings.extend(slurm::diagnose(&inputs));
    findings.extend(k8s::check(k8s, pods).await);
    Ok(Report::new(cluster, version, findings))
}

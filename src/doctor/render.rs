//! The report for people: one line per check (status, setting, what was found, where), and for
//! each one not ok: what the runbook wants, why it matters and the fix.

use super::{Report, Severity, Status};

fn tag(status: Status, severity: Severity) -> &'static str {
    match (status, severity) {
        (Status::Ok, _) => "ok",
        (Status::Finding, Severity::Critical) => "CRITICAL",
        (Status::Finding, Severity::Warning) => "WARNING",
        (Status::Finding, Severity::Info) => "info",
        (Status::Unknown, _) => "UNKNOWN",
        (Status::NotChecked, _) => "skipped",
    }
}

pub fn text(r: &Report) -> String {
    let mut s = format!("cluster {}, Slurm {}\n", r.cluster, r.slurm_version);
    for f in &r.findings {
        let found = match (f.found.is_empty(), f.status) {
            (false, _) => f.found.as_str(),
            (true, Status::Unknown) => "(not read)",
            (true, _) => "(not set)",
        };
        if f.status == Status::NotChecked {
            s.push_str(&format!("{:<8}  {}  [{}]\n", tag(f.status, f.severity), f.setting, f.source));
        } else {
            s.push_str(&format!("{:<8}  {}: {found}  [{}]\n", tag(f.status, f.severity), f.setting, f.source));
        }
        if let Some(n) = &f.note {
            s.push_str(&format!("          note: {n}\n"));
        }
        if matches!(f.status, Status::Finding | Status::Unknown) {
            s.push_str(&format!(
                "          want: {}\n          why:  {}\n          fix:  {}\n",
                f.expected, f.consequence, f.fix
            ));
        }
    }
    let m = &r.summary;
    s.push_str(&format!(
        "{} critical, {} warning(s), {} could not be checked, {} not checked, {} ok (exit {})\n",
        m.critical, m.warning, m.unknown, m.not_checked, m.ok, m.exit_code
    ));
    s
}

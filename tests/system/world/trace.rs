//! Every `sacctmgr` the world's processes run, traced by a transparent wrapper put first in their
//! PATH (`tests/fakes/sacctmgr-trace`): when each call started and ended, and which wrote. What
//! the reliability suite checks Slurm writes with (one at a time across replicas, none lost).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

#[derive(Clone)]
pub struct SacctmgrTrace {
    pub log: PathBuf,
}

/// One call: its argv, when it started and ended (`None`: never, as far as the trace knows).
#[derive(Clone, Debug)]
pub struct Call {
    /// The process that ran `sacctmgr` (an onramp process).
    pub ppid: u32,
    pub argv: Vec<String>,
    pub start: f64,
    pub end: Option<f64>,
    pub code: Option<i64>,
}

impl Call {
    /// `add user a,b,…`: more than one user in one call.
    pub fn is_batch(&self) -> bool {
        self.argv.windows(3).any(|a| a[0] == "add" && a[1] == "user" && a[2].contains(','))
    }

    /// A call that changes Slurm (not `show`/`list`).
    pub fn writes(&self) -> bool {
        let verb = self.argv.iter().find(|a| !a.starts_with('-')).map(String::as_str).unwrap_or("");
        !matches!(verb, "show" | "list" | "")
    }
}

impl SacctmgrTrace {
    /// Puts the wrapper in `dir` and returns the settings that make the world's processes use it.
    pub fn install(dir: &Path) -> (Self, BTreeMap<String, String>) {
        std::fs::create_dir_all(dir).unwrap();
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fakes/sacctmgr-trace");
        let _ = std::fs::remove_file(dir.join("sacctmgr"));
        std::os::unix::fs::symlink(script, dir.join("sacctmgr")).unwrap();
        let real = which("sacctmgr").expect("sacctmgr on this host (the Slurm test cluster)");
        let log = dir.join("sacctmgr.jsonl");
        let path = format!("{}:{}", dir.display(), std::env::var("PATH").unwrap_or_default());
        let settings = [
            ("PATH", path),
            ("ONRAMP_REAL_SACCTMGR", real.display().to_string()),
            ("ONRAMP_SACCTMGR_TRACE", log.display().to_string()),
        ];
        (Self { log }, settings.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
    }

    pub fn calls(&self) -> Vec<Call> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut by_pid: BTreeMap<i64, Call> = BTreeMap::new();
        // only whole lines: the wrapper may be writing the last one now
        for line in text.split_inclusive('\n').filter(|l| l.ends_with('\n')) {
            let v: Value = serde_json::from_str(line).unwrap();
            let pid = v["pid"].as_i64().unwrap();
            match v["event"].as_str() {
                Some("start") => {
                    let argv = v["argv"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_string()).collect();
                    let (ppid, start) = (v["ppid"].as_u64().unwrap() as u32, v["at"].as_f64().unwrap());
                    by_pid.insert(pid, Call { ppid, argv, start, end: None, code: None });
                }
                _ => {
                    if let Some(c) = by_pid.get_mut(&pid) {
                        c.end = v["at"].as_f64();
                        c.code = v["code"].as_i64();
                    }
                }
            }
        }
        by_pid.into_values().collect()
    }

    /// Writes that ran at the same time as an earlier one (pairs), and how many writes
    /// there were. A write without an end (its wrapper was killed with it) ends at once.
    pub fn overlapping_writes(&self) -> (Vec<(Call, Call)>, usize) {
        let mut writes: Vec<Call> = self.calls().into_iter().filter(Call::writes).collect();
        writes.sort_by(|a, b| a.start.total_cmp(&b.start));
        let mut overlaps = vec![];
        let mut latest: Option<&Call> = None;
        for w in &writes {
            if let Some(l) = latest
                && w.start < l.end.unwrap_or(l.start)
            {
                overlaps.push((l.clone(), w.clone()));
            }
            if latest.is_none_or(|l| w.end.unwrap_or(w.start) > l.end.unwrap_or(l.start)) {
                latest = Some(w);
            }
        }
        (overlaps, writes.len())
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var("PATH").ok()?.split(':').map(|d| Path::new(d).join(program)).find(|p| p.is_file())
}

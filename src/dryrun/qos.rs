//! The simulated QOS table: `sacctmgr show qos`, `add qos` and `modify qos`, in the `-n -P` form
//! the real backend reads (name, priority, maxtrespu, maxjobspu). Like every Slurm, it starts
//! with `normal`.

use std::collections::BTreeMap;

use crate::backends::exec::Output;

#[derive(Clone, Debug, Default)]
struct Qos {
    priority: String,
    max_tres_per_user: BTreeMap<String, String>,
    max_jobs_per_user: String,
}

#[derive(Clone, Debug)]
pub(super) struct QosTable(BTreeMap<String, Qos>);

impl Default for QosTable {
    fn default() -> Self {
        Self(BTreeMap::from([("normal".to_string(), Qos { priority: "0".into(), ..Default::default() })]))
    }
}

fn out(code: i32, stdout: String) -> Output {
    Output { code, stdout, stderr: String::new() }
}

impl Qos {
    fn set(&mut self, key: &str, value: &str) {
        let limit = |v: &str| if v == "-1" { String::new() } else { v.to_string() };
        match key.to_ascii_lowercase().as_str() {
            "priority" => self.priority = value.to_string(),
            "maxjobsperuser" | "maxjobspu" => self.max_jobs_per_user = limit(value),
            "maxtresperuser" | "maxtrespu" => {
                for (k, n) in value.split(',').filter_map(|p| p.split_once('=')) {
                    if n == "-1" {
                        self.max_tres_per_user.remove(k);
                    } else {
                        self.max_tres_per_user.insert(k.to_string(), n.to_string());
                    }
                }
            }
            _ => {}
        }
    }
}

impl QosTable {
    /// `show qos where name=a,b …`; every QOS without a name condition.
    pub(super) fn show(&self, names: &[String]) -> Output {
        let rows = self.0.iter().filter(|(n, _)| names.is_empty() || names.contains(n)).map(|(n, q)| {
            let tres: Vec<String> = q.max_tres_per_user.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!("{n}|{}|{}|{}\n", q.priority, tres.join(","), q.max_jobs_per_user)
        });
        out(0, rows.collect())
    }

    pub(super) fn add(&mut self, name: &str, sets: &[(String, String)]) -> Output {
        if self.0.contains_key(name) {
            return out(1, " Nothing new added.\n".into());
        }
        let mut q = Qos { priority: "0".into(), ..Default::default() };
        sets.iter().for_each(|(k, v)| q.set(k, v));
        self.0.insert(name.to_string(), q);
        out(0, format!(" Adding QOS(s)\n  {name}\n"))
    }

    pub(super) fn modify(&mut self, names: &[String], sets: &[(String, String)]) -> Output {
        let mut n = 0;
        for (_, q) in self.0.iter_mut().filter(|(n, _)| names.contains(n)) {
            sets.iter().for_each(|(k, v)| q.set(k, v));
            n += 1;
        }
        if n == 0 { out(1, " Nothing modified\n".into()) } else { out(0, " Modified qos...\n".into()) }
    }
}

//! QOS: the ones the registry declares are created (`sacctmgr add qos`) or converged (`modify
//! qos`) before any association names them, and read back (`sacctmgr show qos -P`). A QOS is
//! cluster-wide (slurmdbd's), not one tenant's: nothing here deletes one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::command::Sets;
use super::parse::Outcome;
use super::*;
use crate::backends::exec::Command;
use crate::domain::names::QosName;
use crate::domain::tenants::QosDecl;

/// A QOS as it should be. `None` leaves a setting alone; `Some` makes it so.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosSpec {
    pub name: QosName,
    pub priority: Option<u32>,
    pub max_tres_per_user: Option<Tres>,
    pub max_jobs_per_user: Option<Limit>,
}

impl QosSpec {
    /// The registry's declaration as a spec; Err names the setting Slurm would not take.
    pub fn from_decl(d: &QosDecl) -> Result<Self, String> {
        let tres = match &d.max_tres_per_user {
            Some(t) => Some(Tres::parse(t).map_err(|e| format!("qos {}: max_tres_per_user: {e}", d.name))?),
            None => None,
        };
        Ok(Self {
            name: d.name.clone(),
            priority: d.priority,
            max_tres_per_user: tres,
            max_jobs_per_user: d.max_jobs_per_user.map(|n| Limit::At(n.into())),
        })
    }
}

/// A QOS as `sacctmgr show qos` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct QosState {
    pub name: String,
    pub priority: u32,
    pub max_tres_per_user: Tres,
    pub max_jobs_per_user: Limit,
}

const QOS_FORMAT: &str = "format=name,priority,maxtrespu,maxjobspu";

/// `sacctmgr -n -P show qos where name=a,b format=…`
pub fn show_qos(names: &[QosName]) -> Command {
    let list: Vec<&str> = names.iter().map(QosName::as_str).collect();
    Command::new("sacctmgr")
        .args(["-n", "-P", "show", "qos", "where"])
        .arg(format!("name={}", list.join(",")))
        .arg(QOS_FORMAT)
}

pub fn add_qos(name: &QosName, sets: &Sets) -> Command {
    Command::new("sacctmgr")
        .args(["-i", "add", "qos", name.as_str()])
        .args(sets.iter().map(|(k, v)| format!("{k}={v}")))
}

pub fn modify_qos(name: &QosName, sets: &Sets) -> Command {
    Command::new("sacctmgr")
        .args(["-i", "modify", "qos", "where"])
        .arg(format!("name={name}"))
        .arg("set")
        .args(sets.iter().map(|(k, v)| format!("{k}={v}")))
}

/// Rows of [`show_qos`].
pub fn parse_qos(cmd: &str, text: &str) -> Result<Vec<QosState>, SlurmError> {
    let bad = |line: &str, why: String| SlurmError::Parse { cmd: cmd.into(), line: line.into(), why };
    let mut out = vec![];
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let f: Vec<&str> = line.split('|').collect();
        let [name, priority, tres, jobs] = f[..] else {
            return Err(bad(line, format!("expected 4 fields, got {}", f.len())));
        };
        out.push(QosState {
            name: name.to_string(),
            priority: if priority.is_empty() {
                0
            } else {
                priority.parse().map_err(|_| bad(line, "priority".into()))?
            },
            max_tres_per_user: Tres::parse(tres).map_err(|e| bad(line, e.to_string()))?,
            max_jobs_per_user: if jobs.is_empty() {
                Limit::Unlimited
            } else {
                Limit::At(jobs.parse().map_err(|_| bad(line, "maxjobspu".into()))?)
            },
        });
    }
    Ok(out)
}

/// The `set` pairs that turn `cur` into `spec` (all of them when new).
pub fn qos_sets(spec: &QosSpec, cur: Option<&QosState>) -> Sets {
    let mut sets: Sets = vec![];
    if let Some(p) = spec.priority.filter(|p| cur.is_none_or(|c| c.priority != *p)) {
        sets.push(("Priority", p.to_string()));
    }
    if let Some(t) = &spec.max_tres_per_user {
        match cur {
            None if !t.is_empty() => sets.push(("MaxTRESPerUser", t.to_string())),
            None => {}
            Some(c) => sets.extend(t.update_from(&c.max_tres_per_user).map(|u| ("MaxTRESPerUser", u))),
        }
    }
    if let Some(j) = spec.max_jobs_per_user.filter(|j| cur.is_none_or(|c| c.max_jobs_per_user != *j)) {
        sets.push(("MaxJobsPerUser", j.arg()));
    }
    sets
}

impl SlurmCli {
    /// The QOS of these names that Slurm has, by name.
    pub(super) async fn read_qos(&self, names: &[QosName]) -> Result<BTreeMap<String, QosState>, SlurmError> {
        if names.is_empty() {
            return Ok(BTreeMap::new());
        }
        let cmd = show_qos(names);
        let rows = parse_qos(&cmd.to_string(), &self.read(&cmd).await?)?;
        Ok(rows
            .into_iter()
            .filter(|q| names.iter().any(|n| n.as_str() == q.name))
            .map(|q| (q.name.clone(), q))
            .collect())
    }

    /// One read, the adds and modifies needed, one read back.
    pub(super) async fn ensure_qos_all(&self, specs: &[QosSpec]) -> Result<Ensured, SlurmError> {
        let names: Vec<QosName> = specs.iter().map(|s| s.name.clone()).collect();
        let current = self.read_qos(&names).await?;
        let mut done = Ensured::default();
        for spec in specs {
            let cur = current.get(spec.name.as_str());
            let sets = qos_sets(spec, cur);
            if cur.is_none() {
                match self.write(&add_qos(&spec.name, &sets)).await? {
                    Outcome::Done => done.created.push(spec.name.to_string()),
                    _ => {
                        return Err(SlurmError::NotConverged {
                            what: format!("adding qos {}", spec.name),
                            want: "added".into(),
                            got: "it appeared meanwhile".into(),
                        });
                    }
                }
            } else if !sets.is_empty() {
                self.write(&modify_qos(&spec.name, &sets)).await?;
                done.changed.extend(sets.iter().map(|(k, _)| format!("{}: {k}", spec.name)));
            }
        }
        if done.is_noop() {
            return Ok(done);
        }
        let back = self.read_qos(&names).await?;
        for spec in specs {
            let got = back.get(spec.name.as_str());
            let left = qos_sets(spec, got);
            if got.is_none() || !left.is_empty() {
                return Err(SlurmError::NotConverged {
                    what: format!("qos {}", spec.name),
                    want: format!("{left:?}"),
                    got: format!("{got:?}"),
                });
            }
        }
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> QosSpec {
        QosSpec {
            name: QosName::parse("high").unwrap(),
            priority: Some(100),
            max_tres_per_user: Some(Tres::gpus(8)),
            max_jobs_per_user: Some(Limit::At(10)),
        }
    }

    #[test]
    fn a_new_qos_gets_everything_an_equal_one_nothing_and_a_different_one_the_difference() {
        let s = spec();
        assert_eq!(
            add_qos(&s.name, &qos_sets(&s, None)).argv(),
            ["sacctmgr", "-i", "add", "qos", "high", "Priority=100", "MaxTRESPerUser=gres/gpu=8", "MaxJobsPerUser=10"]
        );
        let same = parse_qos("t", "high|100|gres/gpu=8|10\n").unwrap();
        assert_eq!(qos_sets(&s, Some(&same[0])), vec![]);
        let other = parse_qos("t", "high|5|cpu=4,gres/gpu=2|\n").unwrap();
        assert_eq!(
            modify_qos(&s.name, &qos_sets(&s, Some(&other[0]))).to_string(),
            "sacctmgr -i modify qos where name=high set Priority=100 MaxTRESPerUser=gres/gpu=8,cpu=-1 MaxJobsPerUser=10"
        );
        assert_eq!(show_qos(std::slice::from_ref(&s.name)).argv()[5..], ["where", "name=high", QOS_FORMAT]);
        assert!(parse_qos("t", "high|x|\n").is_err());
    }
}

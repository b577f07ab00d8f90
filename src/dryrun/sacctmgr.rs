//! A simulated slurmctld host for dry runs: `sacctmgr` (accounts, users, associations, archive
//! dump), `squeue` (no jobs), `scancel`, `scontrol show config`, `ls`, `cat` and the accounting
//! exports (`super::sacct`), answering in the `-n -P` format the real backend parses. State
//! lives in memory; nothing runs.

use std::collections::{BTreeMap, BTreeSet};

use crate::backends::exec::{Command, Output};

#[derive(Clone, Debug, Default)]
struct Assoc {
    parent: String,
    share: String,
    grpjobs: String,
    grpsubmit: String,
    grptres: BTreeMap<String, String>,
    grptresmins: BTreeMap<String, String>,
    maxjobs: String,
    maxsubmit: String,
    qos: String,
    defaultqos: String,
}

fn tres(m: &BTreeMap<String, String>) -> String {
    m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(",")
}

impl Assoc {
    fn row(&self, cluster: &str, account: &str, user: &str) -> String {
        [
            cluster,
            account,
            user,
            "",
            &self.parent,
            &self.share,
            &self.grpjobs,
            &self.grpsubmit,
            &tres(&self.grptres),
            &tres(&self.grptresmins),
            &self.maxjobs,
            &self.maxsubmit,
            &self.qos,
            &self.defaultqos,
        ]
        .join("|")
    }

    /// Applies one `Key=value`; false when the key is not an association's.
    fn set(&mut self, key: &str, value: &str) -> bool {
        let limit = |v: &str| if v == "-1" { String::new() } else { v.to_string() };
        let merge = |m: &mut BTreeMap<String, String>, v: &str| {
            for part in v.split(',').filter(|p| !p.is_empty()) {
                if let Some((k, n)) = part.split_once('=') {
                    if n == "-1" {
                        m.remove(k);
                    } else {
                        m.insert(k.to_string(), n.to_string());
                    }
                }
            }
        };
        match key.to_ascii_lowercase().as_str() {
            "fairshare" => self.share = value.to_string(),
            "grpjobs" => self.grpjobs = limit(value),
            "grpsubmitjobs" => self.grpsubmit = limit(value),
            "grptres" => merge(&mut self.grptres, value),
            "grptresmins" => merge(&mut self.grptresmins, value),
            "maxjobs" => self.maxjobs = limit(value),
            "maxsubmitjobs" => self.maxsubmit = limit(value),
            "qos" => self.qos = value.to_string(),
            "defaultqos" => self.defaultqos = value.to_string(),
            "parent" => self.parent = value.to_string(),
            _ => return false,
        }
        true
    }
}

#[derive(Clone, Debug, Default)]
struct Account {
    descr: String,
    org: String,
    assoc: Assoc,
}

#[derive(Clone, Debug, Default)]
struct User {
    default_account: String,
    assocs: BTreeMap<String, Assoc>,
}

/// The simulated accounting database and slurmctld.
#[derive(Clone, Debug, Default)]
pub struct SlurmSim {
    cluster: String,
    accounts: BTreeMap<String, Account>,
    users: BTreeMap<String, User>,
    files: BTreeMap<String, BTreeSet<String>>,
    qos: super::qos::QosTable,
    exports: super::sacct::Exports,
}

fn ok(stdout: impl Into<String>) -> Output {
    Output { code: 0, stdout: stdout.into(), stderr: String::new() }
}

fn said(code: i32, text: &str) -> Output {
    Output { code, stdout: format!(" {text}\n"), stderr: String::new() }
}

/// `where k=v … set k=v …` (or an add's `k=v …`) as (conditions, settings).
fn clauses(args: &[String]) -> (BTreeMap<String, String>, Vec<(String, String)>) {
    let (mut cond, mut sets, mut in_set) = (BTreeMap::new(), vec![], false);
    for a in args {
        if a == "set" {
            in_set = true;
        } else if let Some((k, v)) = a.split_once('=') {
            if in_set {
                sets.push((k.to_string(), v.to_string()));
            } else {
                cond.insert(k.to_ascii_lowercase(), v.to_string());
            }
        }
    }
    (cond, sets)
}

fn list(v: Option<&String>) -> Vec<String> {
    v.map(|s| s.split(',').filter(|x| !x.is_empty()).map(str::to_string).collect()).unwrap_or_default()
}

impl SlurmSim {
    pub fn new(cluster: &str) -> Self {
        Self { cluster: cluster.to_string(), ..Default::default() }
    }

    /// Answers one command as the slurmctld host would.
    pub fn run(&mut self, cmd: &Command) -> Output {
        let argv = cmd.argv();
        match argv[0].as_str() {
            "sacctmgr" if argv.get(1).is_some_and(|a| a == "-i") => self.write(&argv[2..]),
            "sacctmgr" => self.show(&argv[1..]),
            "squeue" => ok(""),
            "scancel" => ok(""),
            "scontrol" => {
                ok(format!("ClusterName = {}\nAccountingStorageEnforce = associations,limits,qos\n", self.cluster))
            }
            "ls" => ok(self
                .files
                .get(argv.last().map(String::as_str).unwrap_or(""))
                .map_or(String::new(), |f| f.iter().map(|n| format!("{n}\n")).collect::<String>())),
            _ => match self.exports.run(argv, &mut self.files) {
                Some(o) => o,
                None => Output { code: 1, stdout: String::new(), stderr: format!("{}: not simulated\n", argv[0]) },
            },
        }
    }

    fn show(&self, args: &[String]) -> Output {
        let args: Vec<String> = args.iter().filter(|a| !a.starts_with('-') && *a != "show").cloned().collect();
        let (cond, _) = clauses(&args[1..]);
        let format = cond.get("format").cloned().unwrap_or_default();
        let mut rows = vec![];
        match args.first().map(String::as_str) {
            Some("qos") => return self.qos.show(&list(cond.get("name"))),
            Some("account") => {
                for n in list(cond.get("name")) {
                    if let Some(a) = self.accounts.get(&n) {
                        rows.push(format!("{}|{}|{}", a.descr, a.org, a.assoc.row(&self.cluster, &n, "")));
                    }
                }
            }
            Some("user") => {
                for n in list(cond.get("name")) {
                    let Some(u) = self.users.get(&n) else { continue };
                    if format.eq_ignore_ascii_case("user,cluster,account,partition") {
                        rows.extend(u.assocs.keys().map(|a| format!("{n}|{}|{a}|", self.cluster)));
                        continue;
                    }
                    let each = u.assocs.iter().map(|(a, x)| x.row(&self.cluster, a, &n));
                    rows.extend(each.map(|r| format!("{}|{r}", u.default_account)));
                }
            }
            Some("assoc" | "association" | "associations") => {
                let accounts = cond.get("account").or_else(|| cond.get("accounts"));
                let only = accounts.is_some().then(|| list(accounts));
                let mut found: Vec<(&str, &str, &Assoc)> = vec![];
                for (n, a) in &self.accounts {
                    if !cond.contains_key("user") && only.as_ref().is_none_or(|o| o.contains(n)) {
                        found.push((n, "", &a.assoc));
                    }
                }
                for (n, u) in &self.users {
                    for (a, assoc) in &u.assocs {
                        if cond.get("user").is_none_or(|x| x == n) && only.as_ref().is_none_or(|o| o.contains(a)) {
                            found.push((a, n, assoc));
                        }
                    }
                }
                rows = found
                    .into_iter()
                    .map(|(a, u, assoc)| match format.to_ascii_lowercase().as_str() {
                        "account" => a.to_string(),
                        "account,user" => format!("{a}|{u}"),
                        _ => assoc.row(&self.cluster, a, u),
                    })
                    .collect();
            }
            _ => return Output { code: 1, stdout: String::new(), stderr: "sacctmgr: unknown entity\n".into() },
        }
        ok(rows.iter().map(|r| format!("{r}\n")).collect::<String>())
    }

    fn write(&mut self, args: &[String]) -> Output {
        let verb = args.first().map(String::as_str).unwrap_or_default();
        let entity = args.get(1).map(String::as_str).unwrap_or_default();
        let (cond, sets) = clauses(args.get(2..).unwrap_or_default());
        match (verb, entity) {
            ("add", "qos") => self.qos.add(args.get(2).map_or("", String::as_str), &pairs(&args[3..])),
            ("modify", "qos") => self.qos.modify(&list(cond.get("name")), &sets),
            ("add", "account") => {
                let name = args.get(2).cloned().unwrap_or_default();
                if self.accounts.contains_key(&name) {
                    return said(1, "Nothing new added.");
                }
                let mut a = Account {
                    assoc: Assoc {
                        parent: "root".into(),
                        share: "1".into(),
                        qos: "normal".into(),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                for (k, v) in pairs(&args[3..]) {
                    set_account(&mut a, &k, &v);
                }
                if a.assoc.parent != "root" && !self.accounts.contains_key(&a.assoc.parent) {
                    return said(1, &format!("Parent account '{}' doesn't exist.", a.assoc.parent));
                }
                self.accounts.insert(name, a);
                ok(" Adding Account(s)\n")
            }
            ("modify", "account") => {
                let mut n = 0;
                for name in list(cond.get("name")) {
                    if let Some(a) = self.accounts.get_mut(&name) {
                        sets.iter().for_each(|(k, v)| set_account(a, k, v));
                        n += 1;
                    }
                }
                if n == 0 { said(1, "Nothing modified") } else { ok(" Modified account associations...\n") }
            }
            ("add", "user") => {
                let names = list(args.get(2));
                let all = pairs(&args[3..]);
                let account = all.iter().find(|(k, _)| k.eq_ignore_ascii_case("account")).map(|(_, v)| v.clone());
                let Some(account) = account.filter(|a| self.accounts.contains_key(a)) else {
                    let a = all.iter().find(|(k, _)| k.eq_ignore_ascii_case("account")).map_or("", |(_, v)| v);
                    return said(1, &format!("This account '{a}' doesn't exist."));
                };
                let inherited = self.accounts[&account].assoc.qos.clone();
                let mut added = 0;
                for n in names {
                    let u = self.users.entry(n).or_default();
                    if u.assocs.contains_key(&account) {
                        continue;
                    }
                    let mut assoc = Assoc { share: "1".into(), qos: inherited.clone(), ..Default::default() };
                    for (k, v) in &all {
                        if k.eq_ignore_ascii_case("defaultaccount") {
                            u.default_account = v.clone();
                        } else {
                            assoc.set(k, v);
                        }
                    }
                    if u.default_account.is_empty() {
                        u.default_account = account.clone();
                    }
                    u.assocs.insert(account.clone(), assoc);
                    added += 1;
                }
                if added == 0 { said(1, "Nothing new added.") } else { ok(" Adding User(s)\n") }
            }
            ("modify", "user") => {
                let mut n = 0;
                for name in list(cond.get("name")) {
                    let Some(u) = self.users.get_mut(&name) else { continue };
                    for (k, v) in &sets {
                        if k.eq_ignore_ascii_case("defaultaccount") {
                            u.default_account = v.clone();
                            n += 1;
                            continue;
                        }
                        for (a, assoc) in u.assocs.iter_mut() {
                            if cond.get("account").is_none_or(|x| x == a) {
                                assoc.set(k, v);
                                n += 1;
                            }
                        }
                    }
                }
                if n == 0 { said(1, "Nothing modified") } else { ok(" Modified user associations...\n") }
            }
            ("delete", "user") => {
                let name = cond.get("name").cloned().unwrap_or_default();
                let Some(u) = self.users.get_mut(&name) else { return said(1, "Nothing deleted") };
                let before = u.assocs.len();
                u.assocs.retain(|a, _| cond.get("account").is_some_and(|x| x != a));
                let deleted = before - u.assocs.len();
                if u.assocs.is_empty() {
                    self.users.remove(&name);
                }
                if deleted == 0 { said(1, "Nothing deleted") } else { ok(" Deleting user associations...\n") }
            }
            ("delete", "account") => {
                let names = list(cond.get("name"));
                let before = self.accounts.len();
                self.accounts.retain(|a, _| !names.contains(a));
                for u in self.users.values_mut() {
                    u.assocs.retain(|a, _| !names.contains(a));
                }
                self.users.retain(|_, u| !u.assocs.is_empty());
                if self.accounts.len() == before { said(1, "Nothing deleted") } else { ok(" Deleting account(s)...\n") }
            }
            ("archive", "dump") => {
                let dir = pairs(&args[2..]).into_iter().find(|(k, _)| k.eq_ignore_ascii_case("directory"));
                let dir = dir.map(|(_, v)| v).unwrap_or_default();
                let files = self.files.entry(dir).or_default();
                files.insert(format!("{}_job_table_archive_dryrun_{}", self.cluster, files.len() + 1));
                ok(" sacctmgr: SUCCESS\n")
            }
            _ => {
                Output { code: 1, stdout: String::new(), stderr: format!("sacctmgr: {verb} {entity}: not simulated\n") }
            }
        }
    }
}

/// An add's or a set's `Key=value` pairs, keys as written.
fn pairs(args: &[String]) -> Vec<(String, String)> {
    args.iter().filter_map(|a| a.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn set_account(a: &mut Account, k: &str, v: &str) {
    match k.to_ascii_lowercase().as_str() {
        "description" => a.descr = v.to_string(),
        "organization" => a.org = v.to_string(),
        _ => {
            a.assoc.set(k, v);
        }
    }
}

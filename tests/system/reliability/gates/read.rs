//! What the gates read outside onramp: the key Secret at the fake Kubernetes API, the execs it
//! ran, and the associations with an independent `sacctmgr show assoc`.

use std::collections::BTreeSet;

use crate::world::World;
use crate::world::cluster::{self, User};

pub async fn key_in_secret(w: &World, u: &User) -> bool {
    let n = cluster::tenant_k8s(u.tenant);
    let url = format!("/api/v1/namespaces/{}/secrets/{}", n.namespace, n.key_secret);
    let secret = w.k8s.get(&url).await.unwrap().unwrap_or_default();
    secret["data"].get(&u.username).is_some()
}

/// Deletes of the user attempted on the cluster, as the fake Kubernetes API saw them run (the
/// `sacctmgr` in the slurmctld pod, an `rm` of their home in a login pod).
pub async fn deletes_of(w: &World, u: &User) -> usize {
    let home = w.path("home").join(&u.username).display().to_string();
    let name = format!("name={}", u.username);
    let execs = w.k8s.execs().await.unwrap();
    execs
        .iter()
        .filter(|e| {
            let a = &e.argv;
            let sacctmgr = a[0] == "sacctmgr" && a.iter().any(|x| x == "delete") && a.contains(&name);
            let rm = a[0] == "rm" && a.iter().any(|x| *x == home || x.starts_with(&format!("{home}/")));
            sacctmgr || rm
        })
        .count()
}

/// A user's association as `sacctmgr show assoc` prints it, with the limits a block sets.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Row {
    pub account: String,
    pub user: String,
    pub max_jobs: String,
    pub grp_jobs: String,
    pub max_submit: String,
    pub qos: String,
}

impl Row {
    pub fn blocked(&self) -> bool {
        self.max_jobs == "0" && self.grp_jobs == "0"
    }
}

fn rows(accounts: &[&str]) -> Vec<Row> {
    let o = std::process::Command::new("sacctmgr")
        .args(["-n", "-P", "show", "assoc", &format!("account={}", accounts.join(","))])
        .args(["cluster=production", "format=account,user,maxjobs,grpjobs,maxsubmit,qos"])
        .output()
        .unwrap();
    assert!(o.status.success(), "sacctmgr show assoc: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| l.split('|').map(str::to_string).collect::<Vec<_>>())
        .filter(|f| f.len() >= 6 && !f[1].is_empty())
        .map(|f| Row {
            account: f[0].clone(),
            user: f[1].clone(),
            max_jobs: f[2].clone(),
            grp_jobs: f[3].clone(),
            max_submit: f[4].clone(),
            qos: f[5].clone(),
        })
        .collect()
}

pub fn assoc_of(u: &User) -> Option<Row> {
    let mut r = rows(&[&u.account]).into_iter().filter(|r| r.user == u.username).collect::<Vec<_>>();
    assert!(r.len() <= 1, "{}: {r:?}", u.username);
    r.pop()
}

pub fn all_assocs(w: &World) -> BTreeSet<Row> {
    let mut accounts: Vec<&str> = w.tenants.iter().map(|t| t.account.as_str()).collect();
    accounts.extend(w.tenants.iter().filter_map(|t| t.team.as_ref().map(|(a, _)| a.as_str())));
    rows(&accounts).into_iter().collect()
}

/// The fake storage CLI's file of a snapshot (`<fs>@<name>`), if it has one.
pub fn snapshot_file(w: &World, name: &str) -> Option<std::path::PathBuf> {
    let dir = std::fs::read_dir(w.path("storage/snapshots")).ok()?;
    dir.map(|e| e.unwrap().path()).find(|p| p.file_name().unwrap().to_string_lossy().ends_with(&format!("@{name}")))
}

/// The name of the user's export on the day of the archive step (today).
pub fn export_name(u: &User) -> String {
    let d = time::OffsetDateTime::now_utc().date();
    format!(
        "offboard-{}-{}-{}-{:04}{:02}{:02}.sacct",
        u.tenant,
        u.account,
        u.username,
        d.year(),
        u8::from(d.month()),
        d.day()
    )
}

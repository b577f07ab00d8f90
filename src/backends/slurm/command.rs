//! The argv of every Slurm command the backend runs. Names come in as checked types, values as
//! typed limits; nothing here runs anything.

use super::parse::{ASSOC_FORMAT, SQUEUE_FORMAT};
use super::values::HostPath;
use crate::backends::exec::Command;
use crate::domain::names::{ClusterName, SlurmAccount, Username};

/// `Key=value` pairs of a `set` clause or of an `add`.
pub type Sets = Vec<(&'static str, String)>;

fn list<T: AsRef<str>>(names: &[T]) -> String {
    names.iter().map(|n| n.as_ref()).collect::<Vec<_>>().join(",")
}

fn pairs(sets: &Sets) -> impl Iterator<Item = String> + '_ {
    sets.iter().map(|(k, v)| format!("{k}={v}"))
}

fn sacctmgr_read() -> Command {
    Command::new("sacctmgr").args(["-n", "-P", "show"])
}

fn sacctmgr_write() -> Command {
    Command::new("sacctmgr").arg("-i")
}

impl AsRef<str> for SlurmAccount {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Username {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

/// Accounts with their own association on the cluster (and their users' rows, filtered later).
pub fn show_accounts(cluster: &ClusterName, names: &[SlurmAccount]) -> Command {
    sacctmgr_read().args([
        "account".to_string(),
        "where".into(),
        format!("name={}", list(names)),
        format!("cluster={cluster}"),
        "withassoc".into(),
        format!("format=descr,org,{ASSOC_FORMAT}"),
    ])
}

/// Users with their default account and every association on the cluster.
pub fn show_users(cluster: &ClusterName, users: &[Username]) -> Command {
    sacctmgr_read().args([
        "user".to_string(),
        "where".into(),
        format!("name={}", list(users)),
        format!("cluster={cluster}"),
        "withassoc".into(),
        format!("format=defaultaccount,{ASSOC_FORMAT}"),
    ])
}

/// Every association whose account is one of `accounts`, on the cluster.
pub fn show_assocs(cluster: &ClusterName, accounts: &[SlurmAccount]) -> Command {
    sacctmgr_read().args([
        "assoc".to_string(),
        "where".into(),
        format!("account={}", list(accounts)),
        format!("cluster={cluster}"),
        format!("format={ASSOC_FORMAT}"),
    ])
}

/// Every association on every cluster of the database (a cheap read, see docs/slurm.md).
pub fn show_all_assocs() -> Command {
    sacctmgr_read().args(["assoc".to_string(), format!("format={ASSOC_FORMAT}")])
}

pub fn add_account(cluster: &ClusterName, name: &SlurmAccount, sets: &Sets) -> Command {
    sacctmgr_write().args(["add", "account", name.as_str()]).arg(format!("Cluster={cluster}")).args(pairs(sets))
}

pub fn modify_account(cluster: &ClusterName, name: &SlurmAccount, sets: &Sets) -> Command {
    sacctmgr_write()
        .args(["modify", "account", "where"])
        .arg(format!("name={name}"))
        .arg(format!("cluster={cluster}"))
        .arg("set")
        .args(pairs(sets))
}

/// One `add user a,b,c Account=…` for any number of users.
pub fn add_users(cluster: &ClusterName, users: &[Username], account: &SlurmAccount, sets: &Sets) -> Command {
    sacctmgr_write()
        .args(["add", "user"])
        .arg(list(users))
        .arg(format!("Account={account}"))
        .arg(format!("Cluster={cluster}"))
        .args(pairs(sets))
}

/// Sets limits on the users' associations with `account`, or with every account when `None`.
pub fn modify_users(cluster: &ClusterName, users: &[Username], account: Option<&SlurmAccount>, sets: &Sets) -> Command {
    let mut c = sacctmgr_write().args(["modify", "user", "where"]).arg(format!("name={}", list(users)));
    if let Some(a) = account {
        c = c.arg(format!("account={a}"));
    }
    c.arg(format!("cluster={cluster}")).arg("set").args(pairs(sets))
}

pub fn set_default_account(cluster: &ClusterName, users: &[Username], account: &SlurmAccount) -> Command {
    modify_users(cluster, users, None, &vec![("DefaultAccount", account.to_string())])
}

/// Deletes the user's association with `account`, or all of the user's associations on the
/// cluster (and then the user record) when `None`.
pub fn delete_user(cluster: &ClusterName, user: &Username, account: Option<&SlurmAccount>) -> Command {
    let mut c = sacctmgr_write().args(["delete", "user", "where"]).arg(format!("name={user}"));
    if let Some(a) = account {
        c = c.arg(format!("account={a}"));
    }
    c.arg(format!("cluster={cluster}"))
}

/// Deletes the accounts' associations on `cluster`, or, when `None`, the account rows themselves
/// (with their associations on every cluster).
pub fn delete_accounts(cluster: Option<&ClusterName>, names: &[SlurmAccount]) -> Command {
    let c = sacctmgr_write().args(["delete", "account", "where"]).arg(format!("name={}", list(names)));
    match cluster {
        Some(cl) => c.arg(format!("cluster={cl}")),
        None => c,
    }
}

/// Whose jobs, as squeue and scancel take it: a user, or a list of accounts (squeue and scancel
/// match the job's own account only, so a tenant's scope lists its sub-accounts).
pub enum Who<'a> {
    User(&'a Username),
    Accounts(&'a [SlurmAccount]),
    UserIn(&'a Username, &'a [SlurmAccount]),
}

fn who_arg(who: &Who) -> String {
    match who {
        Who::User(u) => format!("--user={u}"),
        Who::Accounts(a) => format!("--account={}", list(a)),
        Who::UserIn(_, a) => format!("--account={}", list(a)),
    }
}

/// Jobs slurmctld still knows (pending, running, completing, …).
pub fn squeue(who: &Who) -> Command {
    let c = Command::new("squeue").args(["--noheader".to_string(), format!("--format={SQUEUE_FORMAT}"), who_arg(who)]);
    match who {
        Who::UserIn(u, _) => c.arg(format!("--user={u}")),
        _ => c,
    }
}

/// The raw ids (`%A`, one per array element, as sacct's JobIDRaw) of every job slurmctld still
/// holds, ended ones included (it keeps them for MinJobAge after they end).
pub fn squeue_ids(who: &Who) -> Command {
    let c = Command::new("squeue").args(["--noheader", "--states=all", "--format=%A"]).arg(who_arg(who));
    match who {
        Who::UserIn(u, _) => c.arg(format!("--user={u}")),
        _ => c,
    }
}

/// Cancels a user's jobs (`--user`), or jobs by id: scancel's `--account` takes one account
/// only (a list cancels nothing, silently), so an account tree's jobs go by the ids squeue listed.
/// Ids must be squeue's (`123`, `123_4`, `123_[5-9]`).
pub fn scancel(who: &Who, ids: &[&str], pending_only: bool) -> Command {
    let c = Command::new("scancel");
    let c = if pending_only { c.arg("--state=PENDING") } else { c };
    match who {
        Who::User(u) => c.arg(format!("--user={u}")),
        Who::Accounts(_) | Who::UserIn(..) => c.arg("--").args(ids.iter().map(|i| i.to_string())),
    }
}

/// A job id as squeue prints it.
pub fn is_job_id(id: &str) -> bool {
    id.starts_with(|c: char| c.is_ascii_digit()) && id.chars().all(|c| c.is_ascii_digit() || "_[]-,".contains(c))
}

pub fn archive_dump(dir: &HostPath) -> Command {
    sacctmgr_write().args(["archive", "dump"]).arg(format!("Directory={}", dir.as_str()))
}

pub fn list_dir(dir: &HostPath) -> Command {
    Command::new("ls").args(["-1A", "--", dir.as_str()])
}

pub fn show_config() -> Command {
    Command::new("scontrol").args(["show", "config"])
}

pub fn read_file(path: &HostPath) -> Command {
    Command::new("cat").args(["--", path.as_str()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c() -> ClusterName {
        ClusterName::parse("production").unwrap()
    }

    #[test]
    fn argv_is_one_element_per_part() {
        let a = SlurmAccount::parse("ml-team-foo").unwrap();
        let users = [Username::parse("alice").unwrap(), Username::parse("bob").unwrap()];
        let cmd = add_users(&c(), &users, &a, &vec![("Fairshare", "parent".into()), ("MaxJobs", "20".into())]);
        assert_eq!(
            cmd.argv(),
            [
                "sacctmgr",
                "-i",
                "add",
                "user",
                "alice,bob",
                "Account=ml-team-foo",
                "Cluster=production",
                "Fairshare=parent",
                "MaxJobs=20"
            ]
        );
        let cmd = modify_users(&c(), &users[..1], None, &vec![("MaxJobs", "0".into())]);
        assert_eq!(cmd.to_string(), "sacctmgr -i modify user where name=alice cluster=production set MaxJobs=0");
        let cmd = add_account(&c(), &a, &vec![("Description", "Tenant Foo".into())]);
        assert_eq!(cmd.argv()[5..], ["Cluster=production", "Description=Tenant Foo"]);
    }

    #[test]
    fn job_commands() {
        let alice = Username::parse("alice").unwrap();
        let u = Who::User(&alice);
        assert_eq!(squeue(&u).to_string(), "squeue --noheader '--format=%i|%u|%a|%T|%r' --user=alice");
        assert_eq!(scancel(&u, &[], true).argv(), ["scancel", "--state=PENDING", "--user=alice"]);
        let accounts = [SlurmAccount::parse("tenant-foo").unwrap(), SlurmAccount::parse("ml-team-foo").unwrap()];
        let t = Who::Accounts(&accounts);
        assert_eq!(squeue(&t).argv()[3], "--account=tenant-foo,ml-team-foo");
        assert_eq!(scancel(&t, &["12", "13_[1-4]"], false).argv(), ["scancel", "--", "12", "13_[1-4]"]);
        assert!(is_job_id("13_[1-4]") && !is_job_id("-1") && !is_job_id("1;x") && !is_job_id(""));
        // one tenant's jobs of a user: both filters for squeue, the ids it listed for scancel
        let ut = Who::UserIn(&alice, &accounts);
        assert_eq!(squeue(&ut).argv()[3..], ["--account=tenant-foo,ml-team-foo", "--user=alice"]);
        assert_eq!(scancel(&ut, &["12"], true).argv(), ["scancel", "--state=PENDING", "--", "12"]);
    }
}

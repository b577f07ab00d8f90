//! What the Slurm backend is asked for and what it reads back: limits as typed values, the
//! desired state of accounts and user associations, associations and jobs as Slurm shows them.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::domain::names::{QosName, SlurmAccount, Username};

/// A count limit (`GrpJobs`, `MaxJobs`, …). Slurm shows an unset limit as an empty field and
/// clears one when given `-1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    Unlimited,
    At(u64),
}

impl Limit {
    /// The value as a `sacctmgr … set` argument.
    pub fn arg(self) -> String {
        match self {
            Limit::Unlimited => "-1".into(),
            Limit::At(n) => n.to_string(),
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Unlimited => f.write_str("unlimited"),
            Limit::At(n) => write!(f, "{n}"),
        }
    }
}

/// `Fairshare=parent` (inherit the parent's share) or a number of shares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fairshare {
    Parent,
    Shares(u32),
}

impl Fairshare {
    pub fn arg(self) -> String {
        match self {
            Fairshare::Parent => "parent".into(),
            Fairshare::Shares(n) => n.to_string(),
        }
    }
}

/// Trackable resources with counts, e.g. `cpu=8,gres/gpu=4` (GrpTRES) or `gres/gpu=10000`
/// (GrpTRESMins). Memory is kept in megabytes (Slurm shows `mem=2G`, accepts `mem=2048`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "BTreeMap<String, u64>", into = "BTreeMap<String, u64>")]
pub struct Tres(BTreeMap<String, u64>);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("TRES {value:?}: {why}")]
pub struct TresError {
    pub value: String,
    pub why: &'static str,
}

fn check_tres_name(name: &str) -> Result<(), TresError> {
    let ok = !name.is_empty()
        && name.as_bytes()[0].is_ascii_lowercase()
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "/_:-".contains(c));
    if ok { Ok(()) } else { Err(TresError { value: name.into(), why: "not a TRES name like cpu or gres/gpu" }) }
}

impl Tres {
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds `name=count`; the name must look like a TRES name (`cpu`, `mem`, `gres/gpu`).
    pub fn with(mut self, name: &str, count: u64) -> Result<Self, TresError> {
        check_tres_name(name)?;
        self.0.insert(name.to_string(), count);
        Ok(self)
    }
    /// Just `gres/gpu=n`.
    pub fn gpus(n: u64) -> Self {
        Self(BTreeMap::from([("gres/gpu".to_string(), n)]))
    }
    pub fn get(&self, name: &str) -> Option<u64> {
        self.0.get(name).copied()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Parses Slurm's form (`cpu=8,gres/gpu=4,mem=2G`); empty means none.
    pub fn parse(s: &str) -> Result<Self, TresError> {
        let mut map = BTreeMap::new();
        for item in s.split(',').filter(|i| !i.is_empty()) {
            let bad = |why| TresError { value: item.to_string(), why };
            let (name, value) = item.split_once('=').ok_or_else(|| bad("expected name=count"))?;
            check_tres_name(name)?;
            let digits_end = value.find(|c: char| !c.is_ascii_digit()).unwrap_or(value.len());
            let n: u64 = value[..digits_end].parse().map_err(|_| bad("the count is not a number"))?;
            let scale: u64 = match &value[digits_end..] {
                "" | "M" => 1,
                "G" => 1 << 10,
                "T" => 1 << 20,
                "P" => 1 << 30,
                _ => return Err(bad("unknown unit")),
            };
            map.insert(name.to_string(), n * scale);
        }
        Ok(Self(map))
    }

    /// The `set GrpTRES=…` argument that turns `current` into `self`: changed and new counts,
    /// and `-1` for every count `self` no longer has. `None` when they are equal.
    pub fn update_from(&self, current: &Tres) -> Option<String> {
        let mut parts: Vec<String> =
            self.0.iter().filter(|(k, v)| current.0.get(*k) != Some(v)).map(|(k, v)| format!("{k}={v}")).collect();
        parts.extend(current.0.keys().filter(|k| !self.0.contains_key(*k)).map(|k| format!("{k}=-1")));
        (!parts.is_empty()).then(|| parts.join(","))
    }
}

impl fmt::Display for Tres {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        f.write_str(&parts.join(","))
    }
}

impl TryFrom<BTreeMap<String, u64>> for Tres {
    type Error = TresError;
    fn try_from(m: BTreeMap<String, u64>) -> Result<Self, TresError> {
        m.keys().try_for_each(|k| check_tres_name(k))?;
        Ok(Self(m))
    }
}

impl From<Tres> for BTreeMap<String, u64> {
    fn from(t: Tres) -> Self {
        t.0
    }
}

/// Free text Slurm stores for an account (Description, Organization): letters, digits, spaces
/// and `-_.()&`, up to 100 characters, not starting with `-` or a space. Slurm lower-cases it.
#[derive(Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct SlurmText(String);

impl SlurmText {
    pub fn parse(s: &str) -> Result<Self, crate::domain::names::NameError> {
        let err =
            |why| Err(crate::domain::names::NameError { kind: "Slurm text", value: s.chars().take(80).collect(), why });
        if s.is_empty() || s.len() > 100 {
            return err("it must have 1 to 100 characters");
        }
        if s.starts_with(['-', ' ']) || s.ends_with(' ') {
            return err("it must not start with - or a space, nor end with a space");
        }
        if !s.chars().all(|c| c.is_ascii_alphanumeric() || " -_.()&".contains(c)) {
            return err("only letters, digits, spaces and -_.()& are allowed");
        }
        Ok(Self(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
    /// Slurm stores text lower-cased; compare that way.
    pub fn matches(&self, stored: &str) -> bool {
        self.0.eq_ignore_ascii_case(stored)
    }
}

impl fmt::Debug for SlurmText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SlurmText({:?})", self.0)
    }
}

impl<'de> Deserialize<'de> for SlurmText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Self::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Limits of an account's association. `None` leaves a limit alone; `Some` makes it so.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountLimits {
    pub fairshare: Option<Fairshare>,
    pub grp_tres: Option<Tres>,
    pub grp_jobs: Option<Limit>,
}

/// An account as it should be. `parent: None` is `root`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountSpec {
    pub name: SlurmAccount,
    pub parent: Option<SlurmAccount>,
    pub description: SlurmText,
    pub organization: SlurmText,
    pub limits: AccountLimits,
}

/// A tenant's account and its team sub-accounts (each team's parent is the tenant account).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantSpec {
    pub account: AccountSpec,
    pub teams: Vec<AccountSpec>,
}

/// Limits of a user's association. `None` leaves a limit alone; `Some` makes it so.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserLimits {
    pub fairshare: Option<Fairshare>,
    pub default_qos: Option<QosName>,
    /// The association's whole QOS list (not an addition); must not be empty.
    pub qos: Option<Vec<QosName>>,
    pub max_jobs: Option<Limit>,
    pub grp_jobs: Option<Limit>,
    pub grp_tres_mins: Option<Tres>,
}

/// A user's association with one account, as it should be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserSpec {
    pub user: Username,
    pub account: SlurmAccount,
    /// Make `account` the user's DefaultAccount.
    pub default_account: bool,
    pub limits: UserLimits,
}

/// One association as `sacctmgr show assoc` reports it (names as Slurm spells them).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Association {
    pub cluster: String,
    pub account: String,
    /// Empty for an account's own association.
    pub user: String,
    pub partition: String,
    /// The parent account, for an account's association; empty for a user's.
    pub parent: String,
    pub fairshare: Fairshare,
    pub grp_jobs: Limit,
    pub grp_submit_jobs: Limit,
    pub grp_tres: Tres,
    pub grp_tres_mins: Tres,
    pub max_jobs: Limit,
    pub max_submit_jobs: Limit,
    pub qos: Vec<String>,
    pub default_qos: String,
}

impl Association {
    /// Blocked the way [`crate::backends::slurm::Slurm::block_user`] blocks: no jobs may run.
    pub fn is_blocked(&self) -> bool {
        if self.user.is_empty() {
            self.grp_jobs == Limit::At(0)
        } else {
            self.max_jobs == Limit::At(0) && self.grp_jobs == Limit::At(0)
        }
    }
}

/// An account row with its own association (from `show account … withassoc`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AccountState {
    pub description: String,
    pub organization: String,
    pub assoc: Association,
}

/// A user's record: the default account and every association on the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UserState {
    pub default_account: String,
    pub assocs: Vec<Association>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Pending,
    Running,
    Suspended,
    Completing,
    Configuring,
    Other(String),
}

/// A job still known to slurmctld (not finished).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Job {
    pub id: String,
    pub user: String,
    pub account: String,
    pub state: JobState,
    /// Why it pends (`Resources`, `AssocGrpJobsLimit`, …); `None` when running.
    pub reason: String,
}

/// Whose jobs: a user's (on any account), a user's in some accounts (one tenant's, when the user
/// belongs to several tenants), or an account's and its sub-accounts'.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobScope {
    User(Username),
    UserIn(Username, Vec<SlurmAccount>),
    Account(SlurmAccount),
}

impl fmt::Display for JobScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobScope::User(u) => write!(f, "user {u}"),
            JobScope::UserIn(u, a) => {
                let a: Vec<&str> = a.iter().map(SlurmAccount::as_str).collect();
                write!(f, "user {u} in {}", a.join(","))
            }
            JobScope::Account(a) => write!(f, "account {a}"),
        }
    }
}

/// What an ensure did. `changed` names each setting it had to change ("created" when new).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Ensured {
    pub created: Vec<String>,
    pub changed: Vec<String>,
}

impl Ensured {
    pub fn is_noop(&self) -> bool {
        self.created.is_empty() && self.changed.is_empty()
    }
}

/// Whether a delete removed something or found it already gone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Deleted {
    Deleted { removed: Vec<String> },
    AlreadyGone,
}

/// Jobs a cancel removed (read before and after), and any left in the scope.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Cancelled {
    pub cancelled: Vec<String>,
    pub remaining: Vec<Job>,
}

/// An absolute path on the Slurm host (where the commands run): `/` and `[A-Za-z0-9._-]` components,
/// no `.` or `..` components.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct HostPath(String);

impl HostPath {
    pub fn parse(s: &str) -> Result<Self, crate::domain::names::NameError> {
        let err =
            |why| Err(crate::domain::names::NameError { kind: "host path", value: s.chars().take(80).collect(), why });
        if !s.starts_with('/') || s.len() > 200 {
            return err("it must be an absolute path of at most 200 characters");
        }
        let parts: Vec<&str> = s.split('/').skip(1).filter(|p| !p.is_empty()).collect();
        if parts.iter().any(|p| *p == "." || *p == ".." || p.starts_with('-')) {
            return err("no ., .. or components starting with -");
        }
        if !parts.iter().all(|p| p.chars().all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))) {
            return err("only letters, digits and ._- in components");
        }
        Ok(Self(s.to_string()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What `archive dump` really wrote: the files that appeared in the directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ArchiveReport {
    pub directory: String,
    pub written: Vec<String>,
    /// sacctmgr's own words (it says SUCCESS even when nothing qualified).
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tres_parses_slurm_form_with_units() {
        let t = Tres::parse("cpu=8,gres/gpu=4,mem=2G").unwrap();
        assert_eq!((t.get("cpu"), t.get("gres/gpu"), t.get("mem")), (Some(8), Some(4), Some(2048)));
        assert!(Tres::parse("").unwrap().is_empty());
        assert!(Tres::parse("cpu").is_err());
        assert!(Tres::parse("cpu=x").is_err());
        assert!(Tres::parse("CPU=1").is_err());
        assert_eq!(t.to_string(), "cpu=8,gres/gpu=4,mem=2048");
    }

    #[test]
    fn tres_update_sets_changes_and_clears_what_is_gone() {
        let cur = Tres::parse("cpu=8,gres/gpu=4").unwrap();
        assert_eq!(Tres::gpus(8).update_from(&cur).as_deref(), Some("gres/gpu=8,cpu=-1"));
        assert_eq!(cur.update_from(&cur), None);
        assert_eq!(Tres::new().update_from(&Tres::gpus(1)).as_deref(), Some("gres/gpu=-1"));
        assert!(Tres::new().with("gres/gpu", 1).is_ok());
        assert!(Tres::new().with("gpu=1,cpu", 1).is_err());
    }

    #[test]
    fn text_and_dirs_are_checked() {
        assert!(SlurmText::parse("Tenant Foo (ML) & co.").is_ok());
        for bad in ["", "-x", " x", "a=b", "a,b", "a'b", "a\"b", "x$y", "é"] {
            assert!(SlurmText::parse(bad).is_err(), "{bad:?}");
        }
        assert!(SlurmText::parse("Tenant Foo").unwrap().matches("tenant foo"));
        assert!(HostPath::parse("/var/spool/slurm/archive").is_ok());
        for bad in ["rel", "/a/../b", "/a/-x", "/a b", "/a;b"] {
            assert!(HostPath::parse(bad).is_err(), "{bad:?}");
        }
    }
}

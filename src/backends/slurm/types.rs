//! What the Slurm backend is asked for and what it reads back: the desired state of accounts and
//! user associations, associations and jobs as Slurm shows them, and what each operation did.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::values::{Fairshare, Limit, SlurmText, Tres};
use crate::domain::names::{QosName, SlurmAccount, Username};

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
pub enum SlurmJobState {
    Pending,
    Running,
    Suspended,
    Completing,
    Configuring,
    Other(String),
}

/// A job still known to slurmctld (not finished).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SlurmJob {
    pub id: String,
    pub user: String,
    pub account: String,
    pub state: SlurmJobState,
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
    /// `add_users` only: each user's record as read after the change (or before, when nothing
    /// changed), the read that verified it. A caller that needs the record reads it here instead
    /// of asking Slurm again (shared: a batch's members each get it).
    #[serde(skip)]
    pub users: Arc<BTreeMap<String, UserState>>,
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
    pub remaining: Vec<SlurmJob>,
}

/// What `archive dump` really wrote: the files that appeared in the directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ArchiveReport {
    pub directory: String,
    pub written: Vec<String>,
    /// sacctmgr's own words (it says SUCCESS even when nothing qualified).
    pub message: String,
}

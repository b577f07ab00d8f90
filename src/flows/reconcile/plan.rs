//! Desired against actual, as pure functions: what to onboard, what to offboard, and whether the
//! safety brake holds a tenant's offboardings.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use serde::Serialize;

use crate::backends::authentik::User;
use crate::domain::names::{SlurmAccount, TenantName, Username};
use crate::domain::tenants::{Tenant, TenantRegistry};
use crate::engine::Budget;

/// The budget every reconcile offboarding takes a slot of (see [`Brake`]).
pub const OFFBOARD_BUDGET: &str = "reconcile.offboard";

/// The safety brake, two checks with the same numbers:
/// - a budget across every tenant and both reconcile paths (a tenant pass and a single user's):
///   at most max(`min_users`, `max_percent` % of the managed users) offboardings start per
///   `window`, counted in the database so that every replica shares it; past it each further one
///   is held for one approval (a fault that drops a few users each pass must not offboard them);
/// - within one pass, a tenant that would lose more than `min_users` users AND more than
///   `max_percent` % of its users has all of them held (an outage that empties a group must not
///   offboard its first few).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Brake {
    pub min_users: usize,
    pub max_percent: u32,
    pub window: Duration,
}

impl Default for Brake {
    fn default() -> Self {
        Self { min_users: 5, max_percent: 10, window: Duration::from_secs(3600) }
    }
}

impl Brake {
    /// Whether one pass's offboardings of a tenant are held whole.
    pub fn holds(&self, offboard: usize, tenant_users: usize) -> bool {
        offboard > self.min_users && offboard * 100 > self.max_percent as usize * tenant_users
    }

    /// Offboardings allowed per window when `managed` users have associations.
    pub fn limit(&self, managed: usize) -> u64 {
        (self.min_users as u64).max(managed as u64 * u64::from(self.max_percent) / 100)
    }

    /// The shared offboarding budget when `managed` users have associations.
    pub fn budget(&self, managed: usize) -> Budget {
        Budget { name: OFFBOARD_BUDGET.into(), limit: self.limit(managed), window: self.window }
    }
}

/// One user in one account, as Authentik says it should be.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Member {
    pub pk: i64,
    pub username: Username,
    pub uid_number: u32,
    pub gid_number: u32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Onboard,
    Offboard,
}

/// One thing to do.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Action {
    pub op: Op,
    pub tenant: TenantName,
    pub account: SlurmAccount,
    pub username: Username,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub member: Option<Member>,
    pub reason: String,
}

/// The outcome for one tenant.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TenantPlan {
    pub tenant: String,
    pub onboard: Vec<Action>,
    pub offboard: Vec<Action>,
    /// Offboardings the brake holds (not in `offboard`).
    pub held: Vec<Action>,
    pub brake_reason: Option<String>,
    pub unchanged: usize,
    /// Members onramp cannot handle (e.g. a username the cluster does not allow).
    pub skipped: Vec<String>,
}

/// Checks a user's name and numbers; `Err` says why the user is skipped.
pub fn member(reg: &TenantRegistry, u: &User) -> Result<Member, String> {
    let username = Username::parse(&u.username).map_err(|e| format!("Authentik user {}: {e}", u.pk))?;
    let (uid_number, gid_number) = reg.check_identity(username.as_str(), u.pk, &u.attributes)?;
    Ok(Member { pk: u.pk, username, uid_number, gid_number })
}

/// Each user of `members` (group name → its members) with the groups they are in.
pub fn groups_by_user(members: &BTreeMap<String, Vec<User>>) -> BTreeMap<i64, (&User, Vec<String>)> {
    let mut users: BTreeMap<i64, (&User, Vec<String>)> = BTreeMap::new();
    for (group, list) in members {
        for u in list {
            users.entry(u.pk).or_insert((u, vec![])).1.push(group.clone());
        }
    }
    users
}

/// Associations whose limits differ from those their tenant gives its users, with the limits
/// (sacctmgr's names) that differ.
pub type Drifted = BTreeMap<(SlurmAccount, Username), Vec<&'static str>>;

/// One tenant: `members` are the active members of each of its groups (by group name, every
/// group listed), `actual` the associations under its accounts, `drifted` those of them whose
/// limits differ (an active member's is converged by an onboarding).
pub fn plan_tenant(
    reg: &TenantRegistry,
    tenant: &Tenant,
    members: &BTreeMap<String, Vec<User>>,
    actual: &[(SlurmAccount, Username)],
    drifted: &Drifted,
    brake: Option<Brake>,
) -> TenantPlan {
    let mut plan = TenantPlan { tenant: tenant.name.to_string(), ..Default::default() };
    // every user's groups among this tenant's
    let users = groups_by_user(members);
    let mut desired: BTreeMap<(SlurmAccount, Username), Member> = BTreeMap::new();
    // members onramp may not handle: neither onboarded nor, since they are members, offboarded
    let mut untouchable: BTreeSet<String> = BTreeSet::new();
    for (u, groups) in users.values() {
        let accounts = tenant.placement(groups);
        if accounts.is_empty() {
            continue;
        }
        match member(reg, u) {
            Ok(m) => {
                for a in accounts {
                    desired.insert((a, m.username.clone()), m.clone());
                }
            }
            Err(why) => {
                plan.skipped.push(why);
                untouchable.insert(u.username.clone());
            }
        }
    }
    for (uid, names) in shared_uids(&desired) {
        plan.skipped.push(format!("uid {uid} is shared by {}: each user needs a uid of their own", names.join(", ")));
        desired.retain(|_, m| m.uid_number != uid);
        untouchable.extend(names);
    }
    let accounts = tenant.accounts();
    let actual: BTreeSet<(SlurmAccount, Username)> =
        actual.iter().filter(|(a, _)| accounts.contains(a)).cloned().collect();
    for (key, m) in &desired {
        let (account, username) = key;
        let reason = match (actual.contains(key), drifted.get(key)) {
            (true, None) => {
                plan.unchanged += 1;
                continue;
            }
            (true, Some(which)) => {
                format!("association under {account} with limits other than the tenant's: {}", which.join(", "))
            }
            (false, _) => format!("active member of {} with no association under {account}", tenant.group),
        };
        plan.onboard.push(Action {
            op: Op::Onboard,
            tenant: tenant.name.clone(),
            account: account.clone(),
            username: username.clone(),
            member: Some(m.clone()),
            reason,
        });
    }
    for (account, username) in &actual {
        if reg.identities.is_reserved(username.as_str()) {
            plan.skipped
                .push(format!("{username} has an association under {account} but is a reserved name: left alone"));
            continue;
        }
        if untouchable.contains(username.as_str()) {
            continue;
        }
        if !desired.contains_key(&(account.clone(), username.clone())) {
            plan.offboard.push(Action {
                op: Op::Offboard,
                tenant: tenant.name.clone(),
                account: account.clone(),
                username: username.clone(),
                member: None,
                reason: format!("association under {account} but not an active member of a group placing them there"),
            });
        }
    }
    if let Some(brake) = brake {
        let tenant_users: BTreeSet<&Username> = actual.iter().map(|(_, u)| u).collect();
        let leaving: BTreeSet<&Username> = plan.offboard.iter().map(|a| &a.username).collect();
        if brake.holds(leaving.len(), tenant_users.len()) {
            plan.brake_reason = Some(format!(
                "safety brake: this pass would offboard {} of {} users of tenant {} (more than {} users and more than {}%); \
                 all of them wait for a person's approval",
                leaving.len(),
                tenant_users.len(),
                tenant.name,
                brake.min_users,
                brake.max_percent
            ));
            plan.held = std::mem::take(&mut plan.offboard);
        }
    }
    plan
}

/// The uids that more than one username would get, with those names.
fn shared_uids(desired: &BTreeMap<(SlurmAccount, Username), Member>) -> Vec<(u32, Vec<String>)> {
    let mut by_uid: BTreeMap<u32, BTreeSet<&str>> = BTreeMap::new();
    for m in desired.values() {
        by_uid.entry(m.uid_number).or_default().insert(m.username.as_str());
    }
    by_uid
        .into_iter()
        .filter(|(_, n)| n.len() > 1)
        .map(|(uid, n)| (uid, n.into_iter().map(String::from).collect()))
        .collect()
}

/// One user: `user` is Authentik's record (None: it does not exist), `actual` the associations
/// of that username under the registry's accounts, `drifted` those whose limits differ.
pub fn plan_user(
    reg: &TenantRegistry,
    user: Option<&User>,
    username: &Username,
    actual: &[(SlurmAccount, Username)],
    drifted: &Drifted,
) -> (Vec<Action>, String) {
    let mine: BTreeSet<SlurmAccount> = actual.iter().filter(|(_, u)| u == username).map(|(a, _)| a.clone()).collect();
    if let Err(why) = reg.identities.check_name(username.as_str()) {
        return (vec![], format!("nothing done: {why}"));
    }
    if let Some(Err(why)) = user.filter(|u| u.is_active).map(|u| member(reg, u))
        && !reg.placements(&user.map(User::group_names).unwrap_or_default()).is_empty()
    {
        return (vec![], format!("nothing done: {why}"));
    }
    let (desired, why_not): (BTreeMap<SlurmAccount, (TenantName, Option<Member>)>, &str) = match user {
        None => (BTreeMap::new(), "not in Authentik"),
        Some(u) if !u.is_active => (BTreeMap::new(), "deactivated in Authentik"),
        Some(u) => {
            let m = member(reg, u).ok();
            let d = reg.placements(&u.group_names()).into_iter().map(|(t, a)| (a, (t, m.clone()))).collect();
            (d, "not in a group placing them there")
        }
    };
    let mut actions = vec![];
    for (account, (tenant, m)) in &desired {
        let reason = if !mine.contains(account) {
            Some(format!("active member placed under {account}, no association there"))
        } else {
            drifted.get(&(account.clone(), username.clone())).map(|which| {
                format!("association under {account} with limits other than the tenant's: {}", which.join(", "))
            })
        };
        if let Some(reason) = reason {
            actions.push(Action {
                op: Op::Onboard,
                tenant: tenant.clone(),
                account: account.clone(),
                username: username.clone(),
                member: m.clone(),
                reason,
            });
        }
    }
    for account in &mine {
        if !desired.contains_key(account) {
            let Some(tenant) = reg.tenant_of_account(account) else {
                continue;
            };
            actions.push(Action {
                op: Op::Offboard,
                tenant: tenant.name.clone(),
                account: account.clone(),
                username: username.clone(),
                member: None,
                reason: format!("association under {account} but {why_not}"),
            });
        }
    }
    let summary = if actions.is_empty() {
        format!("nothing to do: {} association(s) match Authentik", mine.len())
    } else {
        actions
            .iter()
            .map(|a| format!("{:?} {}/{}: {}", a.op, a.account, a.username, a.reason).to_lowercase())
            .collect::<Vec<_>>()
            .join("; ")
    };
    (actions, summary)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;

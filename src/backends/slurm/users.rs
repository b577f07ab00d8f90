//! Users: ensure associations (one or many in one call), block and unblock, delete.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::command::{self, Sets};
use super::parse::{self, Outcome};
use super::*;

/// The `set` pairs that turn the association `cur` into `limits` (all of them when new).
pub(super) fn user_sets(limits: &UserLimits, cur: Option<&Association>) -> Sets {
    let mut sets: Sets = vec![];
    let l = limits;
    if let Some(f) = l.fairshare.filter(|f| cur.is_none_or(|a| a.fairshare != *f)) {
        sets.push(("Fairshare", f.arg()));
    }
    if let Some(q) = &l.qos {
        let mut want: Vec<&str> = q.iter().map(|q| q.as_str()).collect();
        want.sort();
        want.dedup();
        if cur.is_none_or(|a| a.qos != want) {
            sets.push(("QOS", want.join(",")));
        }
    }
    if let Some(d) = l.default_qos.as_ref().filter(|d| cur.is_none_or(|a| a.default_qos != d.as_str())) {
        sets.push(("DefaultQOS", d.to_string()));
    }
    if let Some(j) = l.max_jobs.filter(|j| cur.is_none_or(|a| a.max_jobs != *j)) {
        sets.push(("MaxJobs", j.arg()));
    }
    if let Some(j) = l.grp_jobs.filter(|j| cur.is_none_or(|a| a.grp_jobs != *j)) {
        sets.push(("GrpJobs", j.arg()));
    }
    if let Some(t) = &l.grp_tres_mins {
        match cur {
            None if !t.is_empty() => sets.push(("GrpTRESMins", t.to_string())),
            None => {}
            Some(a) => sets.extend(t.update_from(&a.grp_tres_mins).map(|u| ("GrpTRESMins", u))),
        }
    }
    sets
}

/// The limits (sacctmgr's names) of `limits` that the association `a` does not have: what
/// converging it ([`Slurm::add_users`]) would set. Empty when it matches.
pub fn limits_differ(limits: &UserLimits, a: &Association) -> Vec<&'static str> {
    user_sets(limits, Some(a)).into_iter().map(|(k, _)| k).collect()
}

/// The block (or the unblock to `limits`) as the three job limits it sets.
fn block_values(unblock: Option<&UserLimits>) -> [(&'static str, Limit); 3] {
    match unblock {
        None => [("MaxJobs", Limit::At(0)), ("GrpJobs", Limit::At(0)), ("MaxSubmitJobs", Limit::At(0))],
        Some(l) => [
            ("MaxJobs", l.max_jobs.unwrap_or(Limit::Unlimited)),
            ("GrpJobs", l.grp_jobs.unwrap_or(Limit::Unlimited)),
            ("MaxSubmitJobs", Limit::Unlimited),
        ],
    }
}

fn holds(a: &Association, values: &[(&'static str, Limit); 3]) -> bool {
    [a.max_jobs, a.grp_jobs, a.max_submit_jobs] == [values[0].1, values[1].1, values[2].1]
}

impl SlurmCli {
    /// Users known to Slurm, with their partition-less associations on this cluster.
    pub(super) async fn read_users(&self, users: &[Username]) -> Result<BTreeMap<String, UserState>, SlurmError> {
        let cmd = command::show_users(&self.cluster, users);
        let mut map: BTreeMap<String, UserState> = BTreeMap::new();
        for (default, a) in parse::user_assocs(&cmd.to_string(), &self.read(&cmd).await?)? {
            if a.user.is_empty() {
                continue;
            }
            let entry =
                map.entry(a.user.clone()).or_insert_with(|| UserState { default_account: default, assocs: vec![] });
            if a.cluster == self.cluster.as_str() && a.partition.is_empty() {
                entry.assocs.push(a);
            }
        }
        Ok(map)
    }

    pub(super) async fn ensure_users(
        &self,
        account: &SlurmAccount,
        users: &[Username],
        default_account: bool,
        limits: &UserLimits,
    ) -> Result<Ensured, SlurmError> {
        if limits.qos.as_ref().is_some_and(|q| q.is_empty()) {
            return Err(SlurmError::Invalid("the QOS list of an association must not be empty".into()));
        }
        let mut users = users.to_vec();
        users.sort();
        users.dedup();
        if users.is_empty() {
            return Ok(Ensured::default());
        }
        let assoc_of = |s: &UserState| s.assocs.iter().find(|a| a.account == account.as_str()).cloned();
        let current = self.read_users(&users).await?;
        let mut done = Ensured::default();
        let mut unsure = None;

        let missing: Vec<Username> =
            users.iter().filter(|u| current.get(u.as_str()).and_then(assoc_of).is_none()).cloned().collect();
        if !missing.is_empty() {
            let mut sets = user_sets(limits, None);
            if default_account {
                sets.push(("DefaultAccount", account.to_string()));
            }
            let cmd = command::add_users(&self.cluster, &missing, account, &sets);
            if self.write_read_back(&cmd, &mut unsure).await? == Some(Outcome::Done) {
                done.created.extend(missing.iter().map(|u| u.to_string()));
            }
        }
        // Existing associations whose limits differ: one modify per distinct change.
        let mut by_change: BTreeMap<Vec<(&'static str, String)>, Vec<Username>> = BTreeMap::new();
        for u in &users {
            if let Some(a) = current.get(u.as_str()).and_then(assoc_of) {
                let sets = user_sets(limits, Some(&a));
                if !sets.is_empty() {
                    by_change.entry(sets).or_default().push(u.clone());
                }
            }
        }
        for (sets, who) in &by_change {
            self.write_read_back(&command::modify_users(&self.cluster, who, Some(account), sets), &mut unsure).await?;
            done.changed.extend(who.iter().flat_map(|u| sets.iter().map(move |(k, _)| format!("{u}: {k}"))));
        }
        if default_account {
            let switch: Vec<Username> = users
                .iter()
                .filter(|u| current.get(u.as_str()).is_some_and(|s| s.default_account != account.as_str()))
                .cloned()
                .collect();
            if !switch.is_empty() {
                self.write_read_back(&command::set_default_account(&self.cluster, &switch, account), &mut unsure)
                    .await?;
                done.changed.extend(switch.iter().map(|u| format!("{u}: DefaultAccount")));
            }
        }
        if done.is_noop() && missing.is_empty() && unsure.is_none() {
            return Ok(Ensured { users: Arc::new(current), ..done });
        }
        let back = self.read_users(&users).await?;
        for u in &users {
            let state = back.get(u.as_str());
            let a = state.and_then(assoc_of);
            let left = user_sets(limits, a.as_ref());
            let default_ok = !default_account || state.is_some_and(|s| s.default_account == account.as_str());
            if a.is_none() || !left.is_empty() || !default_ok {
                return Err(unsure.unwrap_or(SlurmError::NotConverged {
                    what: format!("association of {u} with {account}"),
                    want: format!("{left:?}{}", if default_ok { "" } else { " DefaultAccount" }),
                    got: format!("{state:?}"),
                }));
            }
        }
        if unsure.is_some() && done.created.is_empty() {
            // the add's reply was lost, but the read-back shows the associations: it was made
            done.created.extend(missing.iter().map(|u| u.to_string()));
        }
        Ok(Ensured { users: Arc::new(back), ..done })
    }

    pub(super) async fn set_user_block(
        &self,
        user: &Username,
        accounts: &[SlurmAccount],
        unblock: Option<&UserLimits>,
    ) -> Result<Ensured, SlurmError> {
        let values = block_values(unblock);
        let one = std::slice::from_ref(user);
        let ours = |a: &Association| accounts.iter().any(|x| x.as_str() == a.account);
        let Some(state) = self.read_users(one).await?.remove(user.as_str()) else {
            return Ok(Ensured::default()); // no associations: nothing can run
        };
        let todo: Vec<SlurmAccount> = state
            .assocs
            .iter()
            .filter(|a| ours(a) && !holds(a, &values))
            .filter_map(|a| SlurmAccount::parse(&a.account).ok())
            .collect();
        if todo.is_empty() {
            return Ok(Ensured::default());
        }
        let sets: Sets = values.iter().map(|(k, v)| (*k, v.arg())).collect();
        let mut unsure = None;
        for account in &todo {
            self.write_read_back(&command::modify_users(&self.cluster, one, Some(account), &sets), &mut unsure).await?;
        }
        let back = self.read_users(one).await?.remove(user.as_str());
        let assocs: Vec<Association> = back.map(|s| s.assocs).unwrap_or_default().into_iter().filter(ours).collect();
        if let Some(a) = assocs.iter().find(|a| !holds(a, &values)) {
            return Err(unsure.unwrap_or(SlurmError::NotConverged {
                what: format!("{} {user}", if unblock.is_some() { "unblocking" } else { "blocking" }),
                want: format!("{values:?}"),
                got: format!(
                    "MaxJobs={} GrpJobs={} MaxSubmitJobs={} on {}",
                    a.max_jobs, a.grp_jobs, a.max_submit_jobs, a.account
                ),
            }));
        }
        Ok(Ensured { changed: todo.iter().map(|a| format!("{a}: job limits")).collect(), ..Ensured::default() })
    }

    /// Deletes one association (`Some(account)`) or the user (`None`).
    pub(super) async fn remove_user(
        &self,
        user: &Username,
        account: Option<&SlurmAccount>,
    ) -> Result<Deleted, SlurmError> {
        let one = std::slice::from_ref(user);
        let Some(state) = self.read_users(one).await?.remove(user.as_str()) else {
            return Ok(Deleted::AlreadyGone);
        };
        let targeted: Vec<&Association> =
            state.assocs.iter().filter(|a| account.is_none_or(|x| a.account == x.as_str())).collect();
        if targeted.is_empty() && account.is_some() {
            return Ok(Deleted::AlreadyGone);
        }
        let accounts: Vec<SlurmAccount> =
            targeted.iter().filter_map(|a| SlurmAccount::parse(&a.account).ok()).collect();
        let jobs = self.jobs_in(&accounts, Some(user)).await?;
        if !jobs.is_empty() {
            let what = match account {
                Some(a) => format!("user {user} in account {a}"),
                None => format!("user {user}"),
            };
            return Err(SlurmError::JobsActive { what, jobs: jobs.into_iter().map(|j| j.id).collect() });
        }
        if let Some(a) = account.filter(|a| state.default_account == a.as_str()) {
            // Deleting the default association would leave the user without a default account.
            let mut others: Vec<&str> =
                state.assocs.iter().map(|x| x.account.as_str()).filter(|x| *x != a.as_str()).collect();
            others.sort();
            if let Some(other) = others.first().and_then(|o| SlurmAccount::parse(o).ok()) {
                self.write(&command::set_default_account(&self.cluster, one, &other)).await?;
            }
        }
        let mut unsure = None;
        let outcome = self.write_read_back(&command::delete_user(&self.cluster, user, account), &mut unsure).await?;
        let back = self.read_users(one).await?.remove(user.as_str());
        let left: Vec<String> = back
            .map(|s| {
                s.assocs
                    .into_iter()
                    .filter(|a| account.is_none_or(|x| a.account == x.as_str()))
                    .map(|a| a.account)
                    .collect()
            })
            .unwrap_or_default();
        if !left.is_empty() {
            return Err(unsure.unwrap_or(SlurmError::NotConverged {
                what: format!("deleting {user}"),
                want: "gone".into(),
                got: left.join(","),
            }));
        }
        Ok(match outcome {
            Some(Outcome::NothingDeleted) => Deleted::AlreadyGone,
            _ => Deleted::Deleted { removed: targeted.iter().map(|a| format!("{}@{}", a.user, a.account)).collect() },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::names::QosName;

    fn limits() -> UserLimits {
        UserLimits {
            fairshare: Some(Fairshare::Parent),
            default_qos: Some(QosName::parse("normal").unwrap()),
            qos: Some(vec![QosName::parse("normal").unwrap(), QosName::parse("high").unwrap()]),
            max_jobs: Some(Limit::At(20)),
            grp_jobs: None,
            grp_tres_mins: Some(Tres::gpus(10000)),
        }
    }

    fn assoc(line: &str) -> Association {
        parse::assocs("t", line).unwrap().remove(0)
    }

    #[test]
    fn a_new_association_gets_every_managed_limit() {
        let keys: Vec<_> = user_sets(&limits(), None).into_iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["Fairshare", "QOS", "DefaultQOS", "MaxJobs", "GrpTRESMins"]);
        assert_eq!(user_sets(&limits(), None)[1].1, "high,normal");
    }

    #[test]
    fn equal_is_nothing_and_differences_converge() {
        let same = assoc("production|ml|alice|||parent||||gres/gpu=10000|20||high,normal|normal");
        assert_eq!(user_sets(&limits(), Some(&same)), vec![]);
        let blocked = assoc("production|ml|alice|||1|0|||gres/gpu=5|0|0|normal|normal");
        assert_eq!(
            user_sets(&limits(), Some(&blocked)),
            vec![
                ("Fairshare", "parent".to_string()),
                ("QOS", "high,normal".into()),
                ("MaxJobs", "20".into()),
                ("GrpTRESMins", "gres/gpu=10000".into())
            ]
        );
        assert_eq!(limits_differ(&limits(), &blocked), ["Fairshare", "QOS", "MaxJobs", "GrpTRESMins"]);
        assert!(limits_differ(&limits(), &same).is_empty());
        assert!(blocked.is_blocked());
        let vals = block_values(None);
        assert!(holds(&blocked, &vals));
        assert!(!holds(&same, &vals));
        assert!(holds(&same, &block_values(Some(&UserLimits { max_jobs: Some(Limit::At(20)), ..Default::default() }))));
    }
}

//! Who onramp may make into a cluster user: never a system account, never a uid or gid in the
//! system range. A user whose name is reserved or whose numbers fall outside the site's range is
//! neither onboarded nor offboarded by onramp; the drift report lists them with the reason.
//!
//! ```yaml
//! identities:                 # every field optional
//!   reserved_names: [svc-*]   # added to the built-in list (root, slurm, munge, sshd, …); `x*` is a prefix
//!   uid_min: 1000             # default 1000
//!   uid_max: 2147483647       # default 2^31-1
//!   gid_min: 1000
//!   gid_max: 2147483647
//! ```
//!
//! Uniqueness of uids among managed users is kept where onramp sees them together (one reconcile
//! pass) and, lastingly, by the onboarding flow, which claims each uid for one username.

use serde::{Deserialize, Serialize};

/// System and service accounts of the hosts, Slurm, Kubernetes images and Authentik: never a
/// tenant's user (managed keys would write `authorized_keys.d/root`, homes would be chowned to
/// uid 0). Entries ending in `*` are prefixes.
pub const BUILT_IN_RESERVED: &[&str] = &[
    "root",
    "daemon",
    "bin",
    "sys",
    "sync",
    "games",
    "man",
    "lp",
    "mail",
    "news",
    "uucp",
    "proxy",
    "www-data",
    "backup",
    "list",
    "irc",
    "gnats",
    "nobody",
    "nogroup",
    "_apt",
    "systemd-*",
    "messagebus",
    "syslog",
    "sshd",
    "ntp",
    "chrony",
    "polkitd",
    "dbus",
    "tss",
    "uuidd",
    "tcpdump",
    "landscape",
    "pollinate",
    "usbmux",
    "dnsmasq",
    "avahi",
    "rpc",
    "rpcuser",
    "nfsnobody",
    "statd",
    "halt",
    "shutdown",
    "operator",
    "adm",
    "ftp",
    "slurm",
    "slurmdbd",
    "slurmrestd",
    "munge",
    "postgres",
    "mysql",
    "mariadb",
    "nslcd",
    "nscd",
    "sssd",
    "ldap",
    "openldap",
    "admin",
    "administrator",
    "akadmin",
    "authentik",
    "ubuntu",
    "debian",
    "centos",
    "rocky",
    "fedora",
    "ec2-user",
    "cloud-user",
    "kube-*",
    "k8s-*",
    "docker",
    "containerd",
    "onramp",
    "weka",
    "lustre",
    "nvidia-*",
    "prometheus",
    "grafana",
    "node-exporter",
];

/// uid/gid 65534 is `nobody`/`nogroup` on every Linux: files owned by it are the runbook's worst
/// failure, never a user's own.
const NOBODY: u32 = 65534;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct IdentityPolicy {
    /// Names added to [`BUILT_IN_RESERVED`] by the registry.
    pub reserved_names: Vec<String>,
    pub uid_min: u32,
    pub uid_max: u32,
    pub gid_min: u32,
    pub gid_max: u32,
}

impl Default for IdentityPolicy {
    fn default() -> Self {
        Self {
            reserved_names: vec![],
            uid_min: 1000,
            uid_max: i32::MAX as u32,
            gid_min: 1000,
            gid_max: i32::MAX as u32,
        }
    }
}

/// The `identities:` block as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawIdentities {
    #[serde(default)]
    pub(super) reserved_names: Vec<String>,
    pub(super) uid_min: Option<u32>,
    pub(super) uid_max: Option<u32>,
    pub(super) gid_min: Option<u32>,
    pub(super) gid_max: Option<u32>,
}

impl RawIdentities {
    /// The policy, or the mistakes (field, message).
    pub(super) fn policy(self) -> Result<IdentityPolicy, Vec<(String, String)>> {
        let d = IdentityPolicy::default();
        let p = IdentityPolicy {
            reserved_names: self.reserved_names,
            uid_min: self.uid_min.unwrap_or(d.uid_min),
            uid_max: self.uid_max.unwrap_or(d.uid_max),
            gid_min: self.gid_min.unwrap_or(d.gid_min),
            gid_max: self.gid_max.unwrap_or(d.gid_max),
        };
        let mut mistakes = vec![];
        for (what, min, max) in [("uid", p.uid_min, p.uid_max), ("gid", p.gid_min, p.gid_max)] {
            if min == 0 {
                mistakes.push((
                    format!("identities.{what}_min"),
                    format!("{what} 0 is root's: the floor must be 1 or more"),
                ));
            }
            if min > max {
                mistakes
                    .push((format!("identities.{what}_min"), format!("{what}_min {min} is above {what}_max {max}")));
            }
        }
        for (i, n) in p.reserved_names.iter().enumerate() {
            if n.trim_end_matches('*').is_empty() {
                mistakes.push((format!("identities.reserved_names[{i}]"), "an empty name reserves nothing".into()));
            }
        }
        if mistakes.is_empty() { Ok(p) } else { Err(mistakes) }
    }
}

impl IdentityPolicy {
    /// Whether `name` is a system or service account's name (built in or from the registry).
    pub fn is_reserved(&self, name: &str) -> bool {
        let hit = |pattern: &str| match pattern.strip_suffix('*') {
            Some(prefix) => name.starts_with(prefix),
            None => name == pattern,
        };
        BUILT_IN_RESERVED.iter().copied().any(hit) || self.reserved_names.iter().any(|p| hit(p))
    }

    /// Why onramp must not act on `username` at all, if it must not: a reserved name.
    pub fn check_name(&self, username: &str) -> Result<(), String> {
        if self.is_reserved(username) {
            return Err(format!(
                "{username} is a reserved system name (identities.reserved_names and the built-in list): \
                 onramp never onboards or offboards it"
            ));
        }
        Ok(())
    }

    /// Why onramp must not make `username` with these numbers a cluster user, if it must not.
    pub fn check(&self, username: &str, uid: u32, gid: u32) -> Result<(), String> {
        self.check_name(username)?;
        for (what, n, min, max) in [("uid", uid, self.uid_min, self.uid_max), ("gid", gid, self.gid_min, self.gid_max)]
        {
            if n == NOBODY {
                return Err(format!("{username}'s {what} {n} is nobody's: set another {what}Number in Authentik"));
            }
            if n < min || n > max {
                return Err(format!(
                    "{username}'s {what} {n} is outside the site's range {min}..={max} (identities.{what}_min/{what}_max): \
                     set a valid {what}Number in Authentik"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_names_and_numbers_are_refused() {
        let p = IdentityPolicy::default();
        for n in ["root", "slurm", "munge", "sshd", "akadmin", "systemd-network", "nobody"] {
            assert!(p.check(n, 5000, 5000).unwrap_err().contains("reserved"), "{n}");
        }
        assert!(p.check("alice", 5000, 5000).is_ok());
        assert!(p.check("alice", 0, 5000).unwrap_err().contains("uid 0 is outside"));
        assert!(p.check("alice", 5000, 999).unwrap_err().contains("gid 999"));
        assert!(p.check("alice", 65534, 5000).unwrap_err().contains("nobody"));
        assert!(p.check("rooter", 5000, 5000).is_ok(), "only whole names, unless a prefix");
    }

    #[test]
    fn the_registry_adds_names_and_narrows_the_range() {
        let raw = RawIdentities {
            reserved_names: vec!["svc-*".into(), "backupbot".into()],
            uid_min: Some(10000),
            uid_max: Some(60000),
            ..Default::default()
        };
        let p = raw.policy().unwrap();
        assert!(p.check("svc-ci", 20000, 20000).is_err() && p.check("backupbot", 20000, 20000).is_err());
        assert!(p.check("root", 20000, 20000).is_err(), "the built-in list stays");
        assert!(p.check("alice", 9999, 20000).is_err() && p.check("alice", 60001, 20000).is_err());
        assert!(p.check("alice", 20000, 20000).is_ok());
        let bad = RawIdentities { uid_min: Some(0), gid_min: Some(9), gid_max: Some(8), ..Default::default() };
        let m = bad.policy().unwrap_err();
        assert_eq!(m.len(), 2, "{m:?}");
    }
}

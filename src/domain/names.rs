//! Names from outside (Authentik, the registry, the API) parsed into checked types at the edge.
//! Past the edge, code only sees these types; each one is safe as a single argv element, in a
//! path component and in a Slurm `name=value` pair (no spaces, quotes, `=`, `,`, `/`, or a
//! leading `-`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind} {value:?} is not allowed: {why}")]
pub struct NameError {
    pub kind: &'static str,
    pub value: String,
    pub why: &'static str,
}

fn check(kind: &'static str, s: &str, max: usize, extra: &[char]) -> Result<(), NameError> {
    let err = |why| Err(NameError { kind, value: s.chars().take(80).collect(), why });
    if s.is_empty() {
        return err("it is empty");
    }
    if s.len() > max {
        return err("it is too long");
    }
    let first = s.as_bytes()[0];
    if !(first.is_ascii_lowercase() || first == b'_') {
        return err("it must start with a lower-case letter or _");
    }
    if !s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-' || extra.contains(&c)) {
        return err("only lower-case letters, digits, _ and - are allowed");
    }
    Ok(())
}

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident, $kind:literal, $max:expr, $extra:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            pub fn parse(s: &str) -> Result<Self, NameError> {
                check($kind, s, $max, $extra).map(|()| Self(s.to_string()))
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }

        impl std::str::FromStr for $name {
            type Err = NameError;
            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::parse(s)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = NameError;
            fn try_from(s: &str) -> Result<Self, NameError> {
                Self::parse(s)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                Self::parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

name_type!(
    /// A POSIX-portable login name as used on the cluster (`useradd`'s default rule, 32 bytes).
    Username, "username", 32, &[]
);
name_type!(
    /// A tenant: also a Kubernetes namespace suffix and the top Slurm account, so DNS-label-like.
    TenantName, "tenant name", 40, &[]
);
name_type!(
    /// A Slurm account (tenant or team). Slurm lower-cases account names; we require lower case.
    SlurmAccount, "Slurm account", 64, &[]
);
name_type!(
    /// A Slurm QOS name.
    QosName, "QOS name", 64, &[]
);
name_type!(
    /// A Slurm cluster name as registered in slurmdbd (`ClusterName` in slurm.conf).
    ClusterName, "Slurm cluster name", 64, &[]
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn good_names_parse() {
        for s in ["alice", "a", "_svc", "bob-2", "ml_team-foo", "x123456789012345678901234567890y"] {
            assert_eq!(Username::parse(s).unwrap().as_str(), s);
        }
        assert!(SlurmAccount::parse("tenant-foo").is_ok());
        assert!(TenantName::parse("foo").is_ok());
    }

    #[test]
    fn dangerous_names_are_refused() {
        for s in [
            "", "-rf", "--help", "Alice", "al ice", "a;b", "a$(x)", "a`x`", "a|b", "a&b", "a\nb", "a=b", "a,b", "a/b",
            "../x", "ál", "a\"b", "a'b", "9lives", "a.b", "a*", "x\0y",
        ] {
            assert!(Username::parse(s).is_err(), "{s:?} should be refused");
            assert!(SlurmAccount::parse(s).is_err(), "{s:?} should be refused");
        }
        assert!(Username::parse(&"a".repeat(33)).is_err());
    }

    #[test]
    fn errors_say_what_and_why() {
        let e = Username::parse("-rf").unwrap_err();
        assert_eq!(e.to_string(), "username \"-rf\" is not allowed: it must start with a lower-case letter or _");
    }

    #[test]
    fn deserializing_checks_too() {
        assert!(serde_json::from_str::<Username>("\"alice\"").is_ok());
        assert!(serde_json::from_str::<Username>("\"a b\"").is_err());
    }
}

//! OpenSSH public keys: parsed from `authorized_keys` lines, compared by type and key blob (the
//! comment does not matter), and fingerprinted the way `ssh-keygen -l` prints them
//! (`SHA256:` + unpadded base64 of the SHA-256 of the blob).

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("not an OpenSSH public key line: expected \"<type> <base64> [comment]\"")]
    Shape,
    #[error("key type {0:?} is not one onramp accepts")]
    Type(String),
    #[error("the key data is not valid base64")]
    Base64,
    #[error("the key data says {inner:?} but the line says {outer:?}")]
    Mismatch { outer: String, inner: String },
}

const TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// One public key: its type and blob. The comment is kept for display only.
#[derive(Clone, Eq)]
pub struct PublicKey {
    kind: String,
    blob: Vec<u8>,
    comment: String,
}

impl PartialEq for PublicKey {
    /// Same key = same type and blob; comments differ freely between Authentik and a Secret.
    fn eq(&self, other: &Self) -> bool {
        self.kind == other.kind && self.blob == other.blob
    }
}

impl PublicKey {
    /// Parses one `authorized_keys`-style line (no options prefix).
    pub fn parse(line: &str) -> Result<Self, KeyError> {
        let mut parts = line.split_whitespace();
        let (Some(kind), Some(data)) = (parts.next(), parts.next()) else {
            return Err(KeyError::Shape);
        };
        if !TYPES.contains(&kind) {
            return Err(KeyError::Type(kind.chars().take(40).collect()));
        }
        let blob = STANDARD.decode(data).map_err(|_| KeyError::Base64)?;
        // The blob starts with the key type as an SSH string (u32 length, bytes).
        let inner = blob
            .get(..4)
            .map(|l| u32::from_be_bytes([l[0], l[1], l[2], l[3]]) as usize)
            .and_then(|n| blob.get(4..4 + n))
            .map(|t| String::from_utf8_lossy(t).into_owned())
            .ok_or(KeyError::Shape)?;
        if inner != kind {
            return Err(KeyError::Mismatch { outer: kind.into(), inner });
        }
        let comment = parts.collect::<Vec<_>>().join(" ");
        Ok(Self { kind: kind.into(), blob, comment })
    }

    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// `SHA256:…`, as `ssh-keygen -lf` prints it.
    pub fn fingerprint(&self) -> String {
        format!("SHA256:{}", STANDARD_NO_PAD.encode(Sha256::digest(&self.blob)))
    }

    /// The line to write into an `authorized_keys` file (with the comment, if any).
    pub fn to_line(&self) -> String {
        let data = STANDARD.encode(&self.blob);
        if self.comment.is_empty() {
            format!("{} {data}", self.kind)
        } else {
            format!("{} {data} {}", self.kind, self.comment)
        }
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({} {})", self.kind, self.fingerprint())
    }
}

impl std::str::FromStr for PublicKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, KeyError> {
        Self::parse(s)
    }
}

/// Every key in an `authorized_keys` text (blank lines, comments and unparsable lines skipped).
pub fn keys_in(text: &str) -> Vec<PublicKey> {
    text.lines().filter(|l| !l.trim_start().starts_with('#')).filter_map(|l| PublicKey::parse(l).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

    #[test]
    fn parses_and_compares_ignoring_comments() {
        let a = PublicKey::parse(ED).unwrap();
        let b = PublicKey::parse(&ED.replace("alice@laptop", "other")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.kind(), "ssh-ed25519");
        assert_eq!(a.to_line(), ED);
        assert!(a.fingerprint().starts_with("SHA256:") && !a.fingerprint().ends_with('='));
    }

    #[test]
    fn refuses_bad_lines() {
        assert_eq!(PublicKey::parse("ssh-ed25519").unwrap_err(), KeyError::Shape);
        assert!(matches!(PublicKey::parse("ssh-dss AAAA").unwrap_err(), KeyError::Type(_)));
        assert_eq!(PublicKey::parse("ssh-ed25519 !!!").unwrap_err(), KeyError::Base64);
        let lying = ED.replace("ssh-ed25519", "ssh-rsa");
        assert!(matches!(PublicKey::parse(&lying).unwrap_err(), KeyError::Mismatch { .. }));
        assert_eq!(keys_in(&format!("# c\n\n{ED}\njunk\n")).len(), 1);
    }
}

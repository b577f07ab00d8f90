//! The per-tenant key Secret (`<namespace>-authorized-keys` unless the registry names another) in
//! the tenant's namespace: one entry per user (the file sshd reads as `authorized_keys.d/<user>`).
//! Read always; written only when onramp manages keys, with server-side apply under the field
//! manager `onramp`.
//!
//! Writes send the whole `data` map with the `resourceVersion` that was read: server-side apply
//! then fails with 409 (retryable) if someone changed the Secret in between, and a field that
//! onramp stops applying (a removed user) is deleted by the API server. A missing Secret is first
//! created empty (plain create: of two concurrent first writers one gets 409 and retries), so
//! every apply carries a version and no concurrent write is lost.
//!
//! A class of new users onboarded at once all write one Secret. In one process the writes to a
//! Secret are grouped ([`group`]): while one read-and-apply is under way, the edits that arrive
//! wait, and the next writer applies all of them in one read and one apply (a thousand keys were
//! a thousand whole-Secret applies, about 7 a second, before). A 409 from another writer (a
//! replica) is answered by reading again and applying again, a few times with a short jittered
//! pause, before it is returned as a retryable error to every edit of the group.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};

use super::{Call, K8s, K8sError};
use crate::domain::names::Username;
use crate::domain::sshkey::{PublicKey, keys_in};
use crate::domain::tenants::K8sNames;

pub const FIELD_MANAGER: &str = "onramp";

/// What the Secret holds for a user, compared with the key Authentik has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyState {
    /// The tenant's Secret does not exist.
    NoSecret,
    /// The Secret has no entry for the user.
    Missing,
    /// The entry holds the expected key.
    Matches,
    /// The entry holds other keys (their fingerprints).
    Differs { found: Vec<String> },
}

/// What a write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Changed,
    Unchanged,
}

/// Compares an `authorized_keys` text with the expected key.
pub fn compare(text: &str, expected: &PublicKey) -> KeyState {
    let keys = keys_in(text);
    if keys.iter().any(|k| k == expected) {
        KeyState::Matches
    } else if keys.is_empty() && text.trim().is_empty() {
        KeyState::Missing
    } else {
        KeyState::Differs { found: keys.iter().map(PublicKey::fingerprint).collect() }
    }
}

impl K8s {
    fn secrets(&self, names: &K8sNames) -> Api<Secret> {
        Api::namespaced(self.client().clone(), &names.namespace)
    }

    async fn read_secret(&self, names: &K8sNames) -> Result<Option<Secret>, K8sError> {
        let name = &names.keys_secret;
        let call = Call::new("get", "secrets", Some(&names.namespace), Some(name));
        self.call(call, self.secrets(names).get_opt(name)).await
    }

    /// Whether the user's key is in the tenant's Secret, and whether it is the expected one.
    pub async fn key_state(
        &self,
        names: &K8sNames,
        user: &Username,
        expected: &PublicKey,
    ) -> Result<KeyState, K8sError> {
        let Some(secret) = self.read_secret(names).await? else {
            return Ok(KeyState::NoSecret);
        };
        let entry = secret.data.as_ref().and_then(|d| d.get(user.as_str()));
        Ok(match entry {
            None => KeyState::Missing,
            Some(bytes) => compare(&String::from_utf8_lossy(&bytes.0), expected),
        })
    }

    /// Writes the user's key (only when `--manage-keys`). Creates the Secret when missing.
    pub async fn put_key(&self, names: &K8sNames, user: &Username, key: &PublicKey) -> Result<Applied, K8sError> {
        self.edit_keys(names, Edit::Put(user.clone(), key.clone())).await
    }

    /// Removes the user's key (offboarding, only when `--manage-keys`); absent is fine.
    pub async fn remove_key(&self, names: &K8sNames, user: &Username) -> Result<Applied, K8sError> {
        self.edit_keys(names, Edit::Remove(user.clone())).await
    }

    async fn edit_keys(&self, names: &K8sNames, edit: Edit) -> Result<Applied, K8sError> {
        if !self.settings().manage_keys {
            return Err(K8sError::Config("onramp does not manage key Secrets (--manage-keys is off)".into()));
        }
        let group = self.key_writes.of(&format!("{}/{}", names.namespace.as_str(), names.keys_secret));
        group.edit(edit, |edits| self.write_edits(names, edits)).await
    }

    /// Applies the edits in one read and one apply, again on a 409 a few times.
    async fn write_edits(&self, names: &K8sNames, edits: Vec<Edit>) -> Result<Vec<bool>, K8sError> {
        let mut tries = 0;
        loop {
            tries += 1;
            match self.edit_keys_once(names, &edits).await {
                Err(K8sError::Api { code: 409, .. }) if tries < CONFLICT_TRIES => {
                    let pause = Duration::from_millis(5 << tries.min(5)).mul_f64(0.5 + fastrand::f64());
                    tokio::time::sleep(pause).await;
                }
                r => return r,
            }
        }
    }

    /// One read and one conditional apply; which edits changed the entries.
    async fn edit_keys_once(&self, names: &K8sNames, edits: &[Edit]) -> Result<Vec<bool>, K8sError> {
        let name = names.keys_secret.clone();
        let ns = names.namespace.as_str();
        let current = match self.read_secret(names).await? {
            Some(s) => Some(s),
            None => {
                self.create_empty(names).await?;
                self.read_secret(names).await?
            }
        };
        let version = current.as_ref().and_then(|s| s.metadata.resource_version.clone());
        let mut data = current.and_then(|s| s.data).unwrap_or_default();
        let changed: Vec<bool> = edits.iter().map(|e| e.apply(&mut data)).collect();
        if !changed.contains(&true) {
            return Ok(changed);
        }
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ns.into()),
                resource_version: version,
                ..Default::default()
            },
            data: Some(data),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        let pp = PatchParams::apply(FIELD_MANAGER).force();
        let call = Call::new("patch", "secrets", Some(ns), Some(&name));
        self.call(call, self.secrets(names).patch(&name, &pp, &Patch::Apply(&secret))).await?;
        Ok(changed)
    }

    /// Creates the Secret with no data; one that exists already (a concurrent writer) is fine.
    async fn create_empty(&self, names: &K8sNames) -> Result<(), K8sError> {
        let (name, ns) = (names.keys_secret.clone(), names.namespace.as_str());
        let secret = Secret {
            metadata: ObjectMeta { name: Some(name.clone()), namespace: Some(ns.into()), ..Default::default() },
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        let pp = PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() };
        let call = Call::new("create", "secrets", Some(ns), Some(&name));
        match self.call(call, self.secrets(names).create(&pp, &secret)).await {
            Ok(_) => Ok(()),
            Err(K8sError::Api { code: 409, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// How many times a write answered 409 is read and applied again before the 409 is returned.
const CONFLICT_TRIES: u32 = 8;

/// One edit of one user's entry.
#[derive(Clone, Debug)]
pub(super) enum Edit {
    Put(Username, PublicKey),
    Remove(Username),
}

impl Edit {
    /// Edits the entries; whether anything changed.
    fn apply(&self, data: &mut BTreeMap<String, ByteString>) -> bool {
        match self {
            Self::Put(user, key) => {
                let same = data
                    .get(user.as_str())
                    .is_some_and(|old| compare(&String::from_utf8_lossy(&old.0), key) == KeyState::Matches);
                if !same {
                    data.insert(user.to_string(), ByteString(format!("{}\n", key.to_line()).into_bytes()));
                }
                !same
            }
            Self::Remove(user) => data.remove(user.as_str()).is_some(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ED: &str = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl alice@laptop";

    #[test]
    fn compares_entries() {
        let k = PublicKey::parse(ED).unwrap();
        assert_eq!(compare(&format!("{ED}\n"), &k), KeyState::Matches);
        assert_eq!(compare("\n", &k), KeyState::Missing);
        assert!(matches!(compare("junk", &k), KeyState::Differs { found } if found.is_empty()));
    }
}

//! Plain domain types, parsed at the edge: names, SSH keys, the tenant registry, durations and
//! secrets. They import nothing else of the crate.

pub mod duration;
pub mod names;
pub mod secret;
pub mod sshkey;
pub mod tenants;

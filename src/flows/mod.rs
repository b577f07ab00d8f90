//! Flows: plain enums of steps on the engine. They know nothing of SQL.

pub mod selftest;

use crate::engine::Registry;

/// Every flow this build of onramp runs.
pub fn registry() -> Registry {
    Registry::new().with(selftest::SelfTest)
}

//! Fakes of the systems onramp talks to, each speaking the real wire format on its own (this
//! crate does not depend on onramp): the Kubernetes API server ([`k8s`], with exec over WebSocket
//! running commands on this machine) and Authentik's API ([`authentik`]).
//!
//! Each runs in a test's process (`FakeK8s::start()`, `authentik::fake_authentik()`) or as a
//! standalone server (`onramp-fakes k8s|authentik --listen ADDR`, which prints its URL on the
//! first line of stdout). A test in another process drives and checks a standalone fake through
//! its control API under `/_fake/` ([`client`] wraps it). Both can fail a share of their API
//! requests at random ([`chaos`]). Installed as `weka`, `lfs` or `lctl`, the binary is a fake
//! storage CLI instead ([`storage_cli`]).

pub mod authentik;
pub mod chaos;
pub mod client;
pub mod k8s;
pub mod storage_cli;

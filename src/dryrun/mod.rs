//! Dry runs and plans. Every backend's outermost call (a command on a transport, a Kubernetes or
//! Authentik request, a notification) can be recorded (`backends::record`), and every backend has a
//! simulated stand-in that answers without touching anything ([`sim`]). A plan is a flow run
//! step by step against the simulation with the recorders on; `onramp dev` runs the real intake
//! and flows on it. A real run with the same recorders produces the same list (a test checks).
//! [`Recorder`] is a transport that runs nothing, for tests of the argv a backend builds.

pub mod plan;
mod qos;
mod recorder;
mod sacct;
mod sacctmgr;
pub mod sim;
mod storage;

pub use recorder::Recorder;

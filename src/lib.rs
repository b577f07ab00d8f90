//! onramp: onboarding and offboarding for a multi-tenant Slurm GPU cluster, driven by Authentik.
//!
//! The parts, and the one direction their imports run (a test checks it):
//!
//! ```text
//! main → app → http → intake → dryrun → flows → engine → effects
//!                                          flows → backends → domain
//! ```
//!
//! - [`app`]: the command line, settings and the one place the world is built.
//! - [`http`]: webhook intake endpoint, REST API, dashboard, health and metrics.
//! - [`intake`]: verifying and storing Authentik's deliveries.
//! - [`dryrun`]: the simulated world and plans.
//! - [`flows`]: onboarding, offboarding and reconcile as steps on the engine.
//! - [`engine`]: durable jobs, steps, leases and timers; it knows nothing of onboarding.
//! - [`backends`]: one trait per external system, its real implementation and its recorder.
//! - [`domain`]: plain checked types (names, keys, the tenant registry, secrets).
//! - [`effects`]: the record of what a backend did, shared by the engine, backends and plans.

pub mod app;
pub mod backends;
pub mod doctor;
pub mod domain;
pub mod dryrun;
pub mod effects;
pub mod engine;
pub mod flows;
pub mod http;
pub mod intake;

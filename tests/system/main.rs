//! The system test of the shipped binary: the release build of `onramp` run as separate
//! processes as deploy/ configures them, against PostgreSQL, the real Slurm test cluster, the
//! fakes as standalone servers and a real SMTP server (see `world`). Scenarios, one per module,
//! start a `World` each; the world is a harness the reliability and benchmark suites reuse.
//!
//! Needs what `scripts/test` starts (PostgreSQL, the Slurm test cluster, aiosmtpd) and root (the
//! users' unix accounts). `ONRAMP_BIN` / `ONRAMP_FAKES_BIN` name prebuilt binaries.

mod bench;
#[path = "../support/cargo_bin.rs"]
mod cargo_bin;
mod onboarding;
#[path = "../it/otlp.rs"]
mod otlp;
mod reliability;
mod traces;
mod world;

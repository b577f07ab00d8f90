//! One test binary for the whole crate (one link step), a module per area.

mod common;
mod engine_flows;
mod engine_mechanics;
mod engine_processes;
mod cli;
mod intake_cli;
mod intake_reconcile;
mod intake_support;
mod intake_webhook;

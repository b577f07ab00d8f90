//! One test binary for the whole crate (one link step), a module per area.

mod cli;
mod common;
mod dashboard;
mod engine_flows;
mod engine_mechanics;
mod engine_processes;
mod http_api;
mod http_matrix;
mod slurm;

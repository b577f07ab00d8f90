//! One test binary for the whole crate (one link step), a module per area.

mod common;
mod engine_flows;
mod engine_mechanics;
mod engine_processes;
mod cli;
mod fake_k8s;
mod k8s_api;
mod k8s_exec;
mod k8s_rbac;
mod k8s_support;
mod notify;
mod sshkey;
mod storage;

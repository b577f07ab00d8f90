//! One test binary for the whole crate (one link step), a module per area.

mod cli;
mod common;
mod dashboard;
mod engine_flows;
mod engine_mechanics;
mod engine_processes;
mod fake_k8s;
mod flows_support;
mod flows_tenant;
mod flows_user;
mod http_api;
mod http_matrix;
mod http_work;
mod intake_cli;
mod intake_reconcile;
mod intake_support;
mod intake_webhook;
mod k8s_api;
mod k8s_exec;
mod k8s_rbac;
mod k8s_support;
mod notify;
mod schemathesis;
mod slurm;
mod sshkey;
mod storage;

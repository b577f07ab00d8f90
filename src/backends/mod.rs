//! One trait per external system, each with its real implementation; `record` wraps any of them
//! to log what they do, and `dryrun::sim` stands in for them in `dev` and plans. Backends know
//! the domain types and nothing of jobs or flows.

pub mod authentik;
pub mod exec;
pub mod kubernetes;
pub mod notify;
pub mod record;
pub mod slurm;
pub mod ssh;
pub mod storage;

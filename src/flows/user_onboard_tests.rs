//! Tests of `user_onboard.rs`: the smoke job's name, which a later attempt looks for in Slurm.

use super::*;

fn ctx(job_id: i64, created: i64, attempt: u32) -> StepCtx {
    let mut c = StepCtx::detached(USER_ONBOARD, "t/u", json!({}), Default::default(), "smoke_test", 5);
    (c.job_id, c.attempt) = (job_id, attempt);
    c.job_created = time::OffsetDateTime::from_unix_timestamp(created).unwrap();
    c
}

#[test]
fn a_smoke_job_is_named_after_its_job_alone() {
    // every attempt of one job looks for the same name
    assert_eq!(smoke_job_name(&ctx(7, 1_796_000_000, 1)), smoke_job_name(&ctx(7, 1_796_000_000, 3)));
    // job 7 of a database made anew is another job
    assert_ne!(smoke_job_name(&ctx(7, 1_796_000_000, 2)), smoke_job_name(&ctx(7, 1_796_000_900, 2)));
    assert_ne!(smoke_job_name(&ctx(7, 1_796_000_000, 2)), smoke_job_name(&ctx(8, 1_796_000_000, 2)));
}

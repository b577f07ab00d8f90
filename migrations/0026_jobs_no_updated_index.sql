-- Issue 16: `jobs_updated (updated_at)` served only a change feed nothing reads any more (live
-- views follow `job_events`, the audit trail, by id). Every insert, claim and result of a job
-- wrote an entry into it: three index entries a job, on the engine's and the intake's hot paths.
-- `updated_at` stays a column (the API shows it).
drop index if exists jobs_updated;

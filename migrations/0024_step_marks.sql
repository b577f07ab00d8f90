-- Effects a step made that cannot be taken back or safely repeated (an e-mail sent), recorded
-- the moment they happen, apart from the step's result. A worker killed between the effect and
-- the result leaves the mark: the step's next attempt finds it and does not repeat the effect.
-- Pruned with their job.
create table step_marks (
    job_id bigint not null,
    mark text not null,
    marked_at timestamptz not null default now(),
    primary key (job_id, mark)
);

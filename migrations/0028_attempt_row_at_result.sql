-- Issue 16: an attempt's row is written once, when the attempt ends.
--
-- Before, a claim inserted each attempt's row into `step_runs` and the attempt's result updated
-- it: two versions of the row, and index entries for both whenever the update left its page. Now
-- the job's row holds its open attempt while a worker runs it: the attempt's id (drawn at the
-- claim from `step_runs`' own sequence, so ids still follow the order attempts started) and when
-- it started. The attempt's row is written once, with its end: a result, an expired lease, a
-- release at shutdown or a cancel. Readers of a job's attempts see the open one from the job's
-- row (`engine::ops::step_runs`).
alter table jobs add column run_id bigint, add column run_started_at timestamptz;

-- Attempts opened by the previous version keep the rows it inserted; this version's writers end
-- them through `on conflict (job_id, step_index, attempt)`.
update jobs j set run_id = s.id, run_started_at = s.started_at
from step_runs s
where j.lease_owner is not null and s.job_id = j.id and s.step_index = j.step_index and s.attempt = j.attempt
  and s.finished_at is null;

-- rows are no longer updated in place: pack them
alter table step_runs set (fillfactor = 100);

-- The claim's candidates, as in 0027, with what a reclaim needs to write the lost attempt's row.
drop function onramp_claim_candidates(bigint, text[]);
create function onramp_claim_candidates(n bigint, kinds text[])
returns table (id bigint, old_state text, old_attempt int, old_owner text, old_run_id bigint,
               old_run_started_at timestamptz)
language sql volatile rows 256
set enable_sort = off
set enable_bitmapscan = off
set enable_hashjoin = off
set enable_mergejoin = off
as $$
  select j.id, j.state, j.attempt, j.lease_owner, j.run_id, j.run_started_at
  from jobs j
  where j.queue_state in ('pending', 'waiting') and j.run_at <= now() and j.kind = any(kinds)
    and (j.lease_owner is null or j.lease_until <= now())
    and not exists (select 1 from jobs p where p.tenant = j.tenant and p.subject = j.subject and p.id < j.id
                    and p.queue_state not in ('succeeded', 'cancelled'))
  order by j.run_at
  limit n
  for update of j skip locked
$$;

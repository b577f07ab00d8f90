-- Issue 16: a claim writes a HOT version of its job (no index entries).
--
-- Before, a claim set `state = 'running'` and moved `run_at` to the lease's end. Both are in the
-- keys or predicates of `jobs`' indexes, so every claim wrote a new entry into each of them (about
-- five a job). Now the lease is told by `lease_owner` and `lease_until`, which no index reads, and
-- the columns the indexes read (`queue_state`, `run_at`) do not change at a claim or a renewal:
-- with room left on the page the new version is a heap-only tuple.
--
-- `state` stays what every reader sees: `running` while a worker holds the job's lease, else the
-- job's state in the queue. It is computed, so it cannot disagree with the lease.
alter table jobs rename column state to queue_state;
alter table jobs add column lease_until timestamptz;
-- a running job keeps the state it was claimed from; its lease runs until the old `run_at`
update jobs set queue_state = 'pending', lease_until = run_at where queue_state = 'running';
alter table jobs drop constraint jobs_state_check;
alter table jobs add constraint jobs_queue_state_check
    check (queue_state in ('pending', 'waiting', 'needs_approval', 'succeeded', 'failed', 'cancelled'));
alter table jobs add column state text not null
    generated always as (case when lease_owner is not null then 'running' else queue_state end) stored;
-- Room on each page for the new versions of its rows. Jobs are claimed in the order they came
-- due, so a page's rows are claimed together: at 60 % only about 60 % of the claims were HOT, at
-- 40 % all were. An attempt's row gets its result the same way (at 70 %, half of the finishes
-- moved to another page and wrote index entries). Pruning reclaims the old versions in place.
alter table jobs set (fillfactor = 40);
alter table step_runs set (fillfactor = 40);

-- what workers scan: due work; a leased job among it is skipped until its lease expires
drop index jobs_due;
create index jobs_due on jobs (run_at) where queue_state in ('pending', 'waiting');

-- The claim's candidates, as in 0025, with the lease read from the row instead of from `run_at`.
-- A job whose worker holds its lease stays at the front of `jobs_due` (its `run_at` has passed)
-- and is skipped there: at most the workers' concurrency of them.
create or replace function onramp_claim_candidates(n bigint, kinds text[])
returns table (id bigint, old_state text, old_attempt int, old_owner text)
language sql volatile rows 256
set enable_sort = off
set enable_bitmapscan = off
set enable_hashjoin = off
set enable_mergejoin = off
as $$
  select j.id, j.state, j.attempt, j.lease_owner
  from jobs j
  where j.queue_state in ('pending', 'waiting') and j.run_at <= now() and j.kind = any(kinds)
    and (j.lease_owner is null or j.lease_until <= now())
    and not exists (select 1 from jobs p where p.tenant = j.tenant and p.subject = j.subject and p.id < j.id
                    and p.queue_state not in ('succeeded', 'cancelled'))
  order by j.run_at
  limit n
  for update of j skip locked
$$;

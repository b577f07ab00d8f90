-- The latest succeeded jobs of given kinds (tenants overview, drift). The engine takes the kinds
-- from the flows, so its index names none: this replaces jobs_reconcile_done of 0011.
drop index if exists jobs_reconcile_done;
create index jobs_succeeded on jobs (kind, finished_at desc) where state = 'succeeded';

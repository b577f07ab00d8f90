-- Retention: finished jobs are found by when they finished, a batch at a time.
create index jobs_finished on jobs (finished_at) where state in ('succeeded', 'failed', 'cancelled');
-- /v1/tenants counts each tenant's unfinished jobs from these entries only, never its history.
create index jobs_tenant_open on jobs (tenant) where state not in ('succeeded', 'cancelled');

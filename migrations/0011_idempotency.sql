-- Idempotency-Key of the start-work API: per token, the request it answered (a hash of the
-- normalized body) and the job. No foreign key: a key outlives its job, so a replay after the job
-- finished still answers that job instead of starting the work again.
create table idempotency_keys (
    token_name   text        not null,
    key          text        not null,
    request_hash bytea       not null,
    job_id       bigint      not null,
    created_at   timestamptz not null default now(),
    primary key (token_name, key)
);

-- the latest reconcile reports (tenants overview, drift)
create index jobs_reconcile_done on jobs (finished_at desc)
    where kind in ('reconcile.full', 'reconcile.tenant') and state = 'succeeded';

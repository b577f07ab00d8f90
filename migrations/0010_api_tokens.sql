-- API tokens: only a SHA-256 of each token is stored; the token is shown once at creation.
create table api_tokens (
    id          bigint generated always as identity primary key,
    name        text        not null unique,
    role        text        not null check (role in ('admin', 'operator', 'viewer')),
    -- a token scoped to a tenant sees and acts on that tenant's jobs only
    tenant      text,
    hash        bytea       not null unique,
    created_by  text        not null,
    created_at  timestamptz not null default now(),
    expires_at  timestamptz,
    revoked_at  timestamptz,
    last_used_at timestamptz
);

-- the tenant of a job is the first segment of its subject (`tenant-foo/alice` -> `tenant-foo`)
alter table jobs add column tenant text generated always as (split_part(subject, '/', 1)) stored;
create index jobs_tenant on jobs (tenant, id desc);

-- what the dashboard's live view polls
create index jobs_updated on jobs (updated_at);

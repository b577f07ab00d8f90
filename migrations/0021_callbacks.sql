-- Callbacks: subscriptions to job events, delivered as Standard Webhooks-signed POSTs by the
-- workers. Each subscription keeps a cursor into job_events (append-only, ids increasing): every
-- event at or below it was delivered, given up on, or did not match. Delivery is in order, one
-- event at a time per subscription; a worker holds a subscription by a lease while it delivers.
create table callback_subscriptions (
    id              bigint generated always as identity primary key,
    url             text        not null,
    -- only jobs of this tenant (the first segment of their subject); null: every job
    tenant          text,
    -- event types, e.g. {job.succeeded,job.failed}
    events          text[]      not null,
    -- the signing secret (whsec_…): kept, since every delivery is signed with it; never shown again
    secret          text        not null,
    created_by      text        not null,
    created_at      timestamptz not null default now(),
    -- every job_events id at or below this is done for this subscription
    cursor          bigint      not null,
    -- the cursor waits at a missing id (an event committing late) since then; the ids missing up to
    -- held_upto are skipped once they stayed missing for the settle time
    held_since      timestamptz,
    held_upto       bigint,
    -- failed attempts of the event after the cursor
    attempts        int         not null default 0,
    next_attempt_at timestamptz not null default now(),
    lease_owner     text,
    lease_until     timestamptz,
    delivered       bigint      not null default 0,
    given_up        bigint      not null default 0,
    last_status     int,
    last_error      text,
    last_attempt_at timestamptz
);
create index callback_subscriptions_due on callback_subscriptions (next_attempt_at);

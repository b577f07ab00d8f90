-- Webhook intake: every verified delivery, once. A duplicate (same event uuid, webhook-id or,
-- for bodies without either, the same bytes within the hour) is acknowledged and not stored again.

-- ids are UUIDv7 (time-ordered): the primary key grows at its right edge, and id order is
-- arrival order, so no index on received_at is kept on the hot path.
create table webhook_deliveries (
    id            uuid        primary key,
    -- event:<uuid> | webhook-id:<id> | body:<sha256>:<hour>
    delivery_key  text        not null unique,
    source        text        not null default 'authentik',
    received_at   timestamptz not null default now(),
    remote_addr   text,
    -- structured | default | unknown
    shape         text        not null,
    action        text,
    model         text,
    body          jsonb       not null,
    -- what the delivery pointed at, as the intake understood it
    targets       jsonb       not null default '[]'
);

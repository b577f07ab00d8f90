-- Named budgets ("at most so many per window"), shared by every replica: the engine counts the
-- slots granted in the window under a lock on the budget's row, so two replicas can never both
-- take the last slot. What does not fit is held until a person releases it.
create table budgets (
    name  text primary key
);

-- one row per slot granted: which budget, what took it (a job's dedupe key), when
create table budget_grants (
    id          bigint generated always as identity primary key,
    budget      text        not null,
    key         text        not null,
    granted_at  timestamptz not null default now()
);
create index budget_grants_window on budget_grants (budget, granted_at);

-- what the budget held back (one row per key), with what is needed to act on it once released
create table budget_held (
    id       bigint generated always as identity primary key,
    budget   text        not null,
    key      text        not null,
    item     jsonb       not null,
    reason   text        not null,
    held_at  timestamptz not null default now(),
    unique (budget, key)
);

-- Values that belong to one owner for good (the engine's generic claims; the onboarding flow
-- claims each uid for one username, so two users never share a uid, even years apart).
create table claims (
    scope text not null,
    value text not null,
    owner text not null,
    claimed_at timestamptz not null default now(),
    claimed_by_job bigint,
    primary key (scope, value)
);

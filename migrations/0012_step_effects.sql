-- What each attempt did outside onramp: the commands and API requests its step made, in order
-- (a JSON array of {system, call, write}; null when it made none).
alter table step_runs add column effects jsonb;

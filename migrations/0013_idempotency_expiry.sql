-- Idempotency keys answer for 24 hours; expired ones are removed a few at a time.
create index idempotency_keys_created on idempotency_keys (created_at);

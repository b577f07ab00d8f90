-- A delivery whose JSON holds a character jsonb cannot (U+0000) is stored with it replaced by
-- U+FFFD in `body`; the bytes as received are kept here. Null for every other delivery.
alter table webhook_deliveries add column raw_body bytea;

-- One webhook delivery per transaction: a random unique id (like Standard
-- Webhooks' webhook-id) and a small JSON body. Table: see ../run.sh.
\set n random(1, 1000000000)
INSERT INTO webhook_delivery (id, body)
VALUES ('msg_' || gen_random_uuid()::text,
        jsonb_build_object('type', 'user.created', 'client', :client_id, 'n', :n,
                           'data', jsonb_build_object('email', 'user' || :n || '@example.org')));

-- Issue 16: the request path stores only the delivery; a pump off the request path turns stored
-- deliveries into reconcile jobs in bulk (coalescing per subject) and marks them processed in the
-- same transaction. A delivery is pending while `processed_at` is null.
alter table webhook_deliveries
    -- when the pump enqueued (or coalesced) its reconcile jobs; null: not yet
    add column processed_at timestamptz,
    -- the jobs it led to: created for it, or pending ones it was folded into (coalesced)
    add column job_ids      bigint[],
    -- why the pump could not enqueue its jobs (PostgreSQL refused them); processed all the same
    add column pump_error   text,
    -- the W3C trace context of the request's delivery span (only when traces are exported): the
    -- reconcile jobs join that trace
    add column traceparent  text;
-- Deliveries stored before this migration had their jobs enqueued by the request path.
update webhook_deliveries set processed_at = received_at;
-- The pump's queue: pending deliveries, oldest first (ids are UUIDv7, so id order is arrival order).
create index webhook_deliveries_pending on webhook_deliveries (id) where processed_at is null;

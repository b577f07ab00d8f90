-- The W3C trace context (`traceparent`) of the span that enqueued a job, when traces are exported:
-- each attempt of its steps is a span in that trace, so one webhook is one trace across the queue.
alter table jobs add column traceparent text;

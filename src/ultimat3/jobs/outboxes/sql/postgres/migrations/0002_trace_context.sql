-- ultimat3-jobs outbox, PostgreSQL, version 2: the W3C trace context of the enqueue (NULL when
-- no tracing integration is on), carried to the job row by the relay.

ALTER TABLE {schema}.x_outbox ADD COLUMN trace_context text;

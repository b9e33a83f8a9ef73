-- 0004: stored results. result: what the handler returned, as `json` (the serializer's text
-- byte for byte, as `input` is); NULL while the job has not completed, and for a handler that
-- returned None. Written by the completion itself (fenced by the lease, in the same
-- statement), and deleted with the row.

ALTER TABLE {schema}.x_jobs ADD COLUMN result json;

-- ultimat3-jobs SQLite schema, version 4: stored results.
--
-- result: what the handler returned, as JSON text exactly as the serializer wrote it; NULL
-- while the job has not completed, and for a handler that returned None. Written by the
-- completion itself (fenced by the lease, in the same statement), and deleted with the row.

ALTER TABLE x_jobs ADD COLUMN result TEXT;

-- 0003: poison isolation. A job rescued after its worker died is marked isolated: ordinary
-- claims skip it, and a worker runs it alone until it returns (success or an exception clears
-- the mark).

ALTER TABLE {schema}.x_jobs ADD COLUMN isolated boolean NOT NULL DEFAULT false;

-- Empty unless something was rescued, so peeking at it costs nothing.
CREATE INDEX x_jobs_isolated_idx ON {schema}.x_jobs (queue, priority DESC, run_at, id)
    WHERE isolated AND state IN ('scheduled', 'available');

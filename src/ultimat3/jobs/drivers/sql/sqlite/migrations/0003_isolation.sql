-- ultimat3-jobs SQLite schema, version 3: poison isolation.
--
-- A job rescued after its worker died is marked isolated: ordinary claims skip it, and a
-- worker runs it alone until it returns (success or an exception clears the mark).

ALTER TABLE x_jobs ADD COLUMN isolated INTEGER NOT NULL DEFAULT 0 CHECK (isolated IN (0, 1));

-- Empty unless something was rescued, so peeking at it costs nothing.
CREATE INDEX x_jobs_isolated ON x_jobs (queue, priority DESC, run_at, id)
    WHERE isolated = 1 AND state IN ('scheduled', 'available');

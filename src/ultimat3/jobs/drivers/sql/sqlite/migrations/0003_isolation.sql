-- ultimat3-jobs SQLite schema, version 3: poison isolation.
--
-- started: a claimed job's worker recorded, before calling its handler, that it starts it. A
-- job whose lease expires unstarted gets its attempt back; only a started one is rescued as
-- worker_lost, and then marked isolated: ordinary claims skip it, and a worker runs it alone
-- until it returns (success or an exception clears the mark).

ALTER TABLE x_jobs ADD COLUMN started INTEGER NOT NULL DEFAULT 0 CHECK (started IN (0, 1));
ALTER TABLE x_jobs ADD COLUMN isolated INTEGER NOT NULL DEFAULT 0 CHECK (isolated IN (0, 1));

-- Empty unless something was rescued, so peeking at it costs nothing.
CREATE INDEX x_jobs_isolated ON x_jobs (queue, priority DESC, run_at, id)
    WHERE isolated = 1 AND state IN ('scheduled', 'available');

-- 0003: poison isolation. started: a claimed job's worker recorded, before calling its
-- handler, that it starts it. A job whose lease expires unstarted gets its attempt back; only
-- a started one is rescued as worker_lost, and then marked isolated: ordinary claims skip it,
-- and a worker runs it alone until it returns (success or an exception clears the mark).

ALTER TABLE {schema}.x_jobs ADD COLUMN started boolean NOT NULL DEFAULT false;
ALTER TABLE {schema}.x_jobs ADD COLUMN isolated boolean NOT NULL DEFAULT false;

-- Empty unless something was rescued, so peeking at it costs nothing.
CREATE INDEX x_jobs_isolated_idx ON {schema}.x_jobs (queue, priority DESC, run_at, id)
    WHERE isolated AND state IN ('scheduled', 'available');

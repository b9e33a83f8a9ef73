-- 0006: concurrency limits (ultimat3/jobs/limits.py). ({schema}: see 0001.)
--
-- limit_key: the job's concurrency partition, computed at enqueue (NULL: no limit); limit_max:
-- how many of its jobs may run at once. The claim of unlimited jobs keeps its index, now
-- restricted to them, so limited jobs held back by a full limit never stand in its way.

ALTER TABLE {schema}.x_jobs ADD COLUMN limit_key text COLLATE "C";
ALTER TABLE {schema}.x_jobs ADD COLUMN limit_max integer NOT NULL DEFAULT 0;

DROP INDEX {schema}.x_jobs_claim_idx;
CREATE INDEX x_jobs_claim_idx ON {schema}.x_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('scheduled', 'available') AND limit_key IS NULL;

-- Limited waiting jobs, per queue and key in claim order: one seek finds the next key.
CREATE INDEX x_jobs_claim_limited_idx
    ON {schema}.x_jobs (queue, limit_key, priority DESC, run_at, id)
    WHERE state IN ('scheduled', 'available') AND limit_key IS NOT NULL;

-- The running jobs of a key: the count that says whether a slot is free.
CREATE INDEX x_jobs_limit_running_idx ON {schema}.x_jobs (limit_key, lease_expires_at)
    WHERE state = 'running' AND limit_key IS NOT NULL;

-- Rate limits (limits.Rate): at most rate_max starts per rate_period (microseconds) in the
-- partition; 0 is none. A start is a job's attempted_at, so the window is counted from the jobs
-- themselves, through this index (of rate-limited jobs only: no other claim pays for it).
ALTER TABLE {schema}.x_jobs ADD COLUMN rate_max INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {schema}.x_jobs ADD COLUMN rate_period bigint NOT NULL DEFAULT 0;
CREATE INDEX x_jobs_limit_starts_idx ON {schema}.x_jobs (limit_key, attempted_at)
    WHERE limit_key IS NOT NULL AND attempted_at IS NOT NULL AND rate_max > 0;

-- Uniqueness windows (limits.Unique): unique_key, NULL for none, and the states in which a job
-- holds its key (bits as limits.STATE_BITS). The index's predicate reads the row's state, so a
-- job that leaves those states frees its key in the same write. INSERT ... ON CONFLICT must
-- repeat this predicate word for word.
ALTER TABLE {schema}.x_jobs ADD COLUMN unique_key text COLLATE "C";
ALTER TABLE {schema}.x_jobs ADD COLUMN unique_states integer NOT NULL DEFAULT 0;

CREATE UNIQUE INDEX x_jobs_unique_idx ON {schema}.x_jobs (unique_key)
    WHERE unique_key IS NOT NULL
      AND (unique_states & CASE state WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2
                                      WHEN 'running' THEN 4 WHEN 'completed' THEN 8
                                      WHEN 'dead' THEN 16 ELSE 32 END) <> 0;

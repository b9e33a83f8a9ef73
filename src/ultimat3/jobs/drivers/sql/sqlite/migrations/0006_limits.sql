-- ultimat3-jobs SQLite schema, version 6: concurrency limits (ultimat3/jobs/limits.py).
--
-- limit_key: the job's concurrency partition, computed at enqueue (NULL: no limit); limit_max:
-- how many of its jobs may run at once. The claim of unlimited jobs keeps its index, now
-- restricted to them, so limited jobs held back by a full limit never stand in its way.

ALTER TABLE x_jobs ADD COLUMN limit_key TEXT;
ALTER TABLE x_jobs ADD COLUMN limit_max INTEGER NOT NULL DEFAULT 0;

DROP INDEX x_jobs_claim;
CREATE INDEX x_jobs_claim ON x_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('scheduled', 'available') AND limit_key IS NULL;

-- Limited waiting jobs, per queue and key in claim order: one seek finds the next key.
CREATE INDEX x_jobs_claim_limited ON x_jobs (queue, limit_key, priority DESC, run_at, id)
    WHERE state IN ('scheduled', 'available') AND limit_key IS NOT NULL;

-- The running jobs of a key: the count that says whether a slot is free.
CREATE INDEX x_jobs_limit_running ON x_jobs (limit_key, lease_expires_at)
    WHERE state = 'running' AND limit_key IS NOT NULL;

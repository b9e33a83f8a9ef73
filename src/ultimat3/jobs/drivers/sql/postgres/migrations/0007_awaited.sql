-- 0007: awaited. A reader waiting for a job's result (Driver.job_wait, with LISTEN) sets it
-- before its first read; a completion, dead end or cancel NOTIFYs the finished channel only
-- for awaited jobs. A NOTIFY takes one database-wide lock at commit, so a notification for
-- every completion serialised every worker's commits behind it (bench/contention.py:
-- "Lock:object"). The flag and the finishing write meet on the row's lock: whichever commits
-- second sees the other (a finishing UPDATE re-reads a row updated meanwhile; the flag's UPDATE
-- skips a row already final, and the reader then reads it final).

ALTER TABLE {schema}.x_jobs ADD COLUMN awaited boolean NOT NULL DEFAULT false;

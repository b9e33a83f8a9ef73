-- ultimat3-jobs SQLite schema, version 5: live workers.
--
-- One row per worker process, refreshed with its heartbeat and deleted when it exits cleanly;
-- the maintenance node deletes rows whose heartbeat is stale (a worker killed with -9).
-- id is the worker_id the worker writes into the jobs it runs (x_jobs.worker_id).

CREATE TABLE x_workers (
    id           TEXT    PRIMARY KEY,
    host         TEXT    NOT NULL,
    pid          INTEGER NOT NULL,
    queues       TEXT    NOT NULL,  -- JSON array of queue names
    concurrency  INTEGER NOT NULL,
    started_at   INTEGER NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    version      TEXT    NOT NULL
) STRICT, WITHOUT ROWID;

-- Operator reads at scale (queue_list, job_count by queue and state, the metrics and the
-- health check): a count per (queue, state) kept in the transaction that changes the rows,
-- so reading it costs a few rows, not a scan of x_jobs. SQLite has one writer at a time, so
-- these rows add no contention. Updates and deletes are counted by the triggers below;
-- inserts by the driver, one upsert per (queue, state) of a batch (a row trigger cost more
-- than the insert itself), so a row inserted by hand is not counted.
CREATE TABLE x_job_counts (
    queue TEXT    NOT NULL,
    state TEXT    NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
) STRICT, WITHOUT ROWID;

INSERT INTO x_job_counts (queue, state, n)
SELECT queue, state, count(*) FROM x_jobs GROUP BY queue, state;

CREATE TRIGGER x_jobs_count_delete AFTER DELETE ON x_jobs
BEGIN
    UPDATE x_job_counts SET n = n - 1 WHERE queue = old.queue AND state = old.state;
END;

CREATE TRIGGER x_jobs_count_update AFTER UPDATE OF state, queue ON x_jobs
WHEN old.state IS NOT new.state OR old.queue IS NOT new.queue
BEGIN
    INSERT INTO x_job_counts (queue, state, n)
    VALUES (old.queue, old.state, -1), (new.queue, new.state, 1)
    ON CONFLICT (queue, state) DO UPDATE SET n = n + excluded.n;
END;

-- The W3C trace context of the enqueue, when a tracing integration is on (NULL otherwise).
ALTER TABLE x_jobs ADD COLUMN trace_context TEXT;

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

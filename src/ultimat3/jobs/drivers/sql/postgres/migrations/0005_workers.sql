-- 0005: live workers. One row per worker process, refreshed with its heartbeat and deleted
-- when it exits cleanly; the maintenance node deletes rows whose heartbeat is stale (a worker
-- killed with -9). id is the worker_id the worker writes into the jobs it runs.

CREATE TABLE {schema}.x_workers (
    id           text COLLATE "C" PRIMARY KEY,
    host         text        NOT NULL,
    pid          integer     NOT NULL,
    queues       text[]      NOT NULL,
    concurrency  integer     NOT NULL,
    started_at   timestamptz NOT NULL,
    heartbeat_at timestamptz NOT NULL,
    version      text        NOT NULL
);

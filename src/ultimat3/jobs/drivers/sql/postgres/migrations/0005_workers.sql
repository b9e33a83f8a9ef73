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

-- Operator reads at scale (queue_list, job_count by queue and state, the metrics and the
-- health check): per (queue, state), signed deltas appended by statement-level triggers in
-- the transaction that changes the rows. Appending never waits for another transaction (a
-- row per (queue, state) updated in place would serialise every worker's commits on it);
-- the maintenance node folds the deltas into one row per (queue, state) as it prunes, so a
-- read sums a few rows, not a scan of x_jobs.
CREATE TABLE {schema}.x_job_counts (
    queue text COLLATE "C" NOT NULL,
    state text   NOT NULL,
    n     bigint NOT NULL
);

INSERT INTO {schema}.x_job_counts (queue, state, n)
SELECT queue, state, count(*) FROM {schema}.x_jobs GROUP BY queue, state;

CREATE FUNCTION {schema}.x_jobs_count_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.x_job_counts (queue, state, n)
    SELECT queue, state, count(*) FROM new_rows GROUP BY queue, state;
    RETURN NULL;
END $$;

CREATE FUNCTION {schema}.x_jobs_count_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.x_job_counts (queue, state, n)
    SELECT queue, state, -count(*) FROM old_rows GROUP BY queue, state;
    RETURN NULL;
END $$;

CREATE FUNCTION {schema}.x_jobs_count_update() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.x_job_counts (queue, state, n)
    SELECT queue, state, sum(d) FROM (
        SELECT queue, state, -1 AS d FROM old_rows
        UNION ALL
        SELECT queue, state, 1 AS d FROM new_rows
    ) changes
    GROUP BY queue, state
    HAVING sum(d) <> 0;
    RETURN NULL;
END $$;

CREATE TRIGGER x_jobs_count_insert AFTER INSERT ON {schema}.x_jobs
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.x_jobs_count_insert();
CREATE TRIGGER x_jobs_count_delete AFTER DELETE ON {schema}.x_jobs
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.x_jobs_count_delete();
CREATE TRIGGER x_jobs_count_update AFTER UPDATE ON {schema}.x_jobs
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.x_jobs_count_update();

-- TRUNCATE fires no row or DELETE trigger: an emptied table has no counts either.
CREATE FUNCTION {schema}.x_jobs_count_truncate() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM {schema}.x_job_counts;
    RETURN NULL;
END $$;

CREATE TRIGGER x_jobs_count_truncate AFTER TRUNCATE ON {schema}.x_jobs
    FOR EACH STATEMENT EXECUTE FUNCTION {schema}.x_jobs_count_truncate();

-- The W3C trace context of the enqueue, when a tracing integration is on (NULL otherwise).
ALTER TABLE {schema}.x_jobs ADD COLUMN trace_context text;

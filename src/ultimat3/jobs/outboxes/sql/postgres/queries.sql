-- Named queries of the PostgreSQL outbox store (outboxes/postgres.py); see ultimat3/jobs/sql.py
-- for the block format. {schema} stands for the quoted, validated schema identifier; every
-- value is a bound %(name)s parameter. `coalesce(%(now)s, now())` lets the database clock
-- decide unless a caller pins the time.

-- name: migrate_lock
SELECT pg_advisory_xact_lock(%(key)s)

-- name: migrate_has_ledger
-- Read from pg_class (an MVCC snapshot per statement), not to_regclass: its catalog cache may
-- still hold "no such table" from before another process's migration committed.
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relname = 'x_outbox_migrations'
)

-- name: migrate_applied
SELECT version FROM {schema}.x_outbox_migrations ORDER BY version

-- name: server_identity
-- Two connections reach the same database when the first three agree.
SELECT current_database(),
       (SELECT oid FROM pg_database WHERE datname = current_database()),
       pg_postmaster_start_time(),
       to_regclass(%(table)s) IS NOT NULL

-- name: stage
INSERT INTO {schema}.x_outbox
    (id, job, queue, input, idempotency_key, max_attempts, priority, run_at, staged_at,
     tenant_id, trace_context)
VALUES (%(id)s, %(job)s, %(queue)s, %(input)s::json, %(key)s, %(max_attempts)s, %(priority)s,
        -- a delay counts from staging, on this database's clock
        CASE WHEN %(delay)s::interval IS NULL THEN %(run_at)s::timestamptz
             ELSE coalesce(%(now)s::timestamptz, now()) + %(delay)s::interval END,
        coalesce(%(now)s::timestamptz, now()), %(tenant_id)s, %(trace_context)s)

-- name: claim
-- Seed SQL_OUTBOX_CLAIM: rows another relay holds are skipped, never waited for.
SELECT id, job, queue, input::text, idempotency_key, max_attempts, priority, run_at, staged_at,
       tenant_id, published_at, trace_context
FROM {schema}.x_outbox
WHERE published_at IS NULL
ORDER BY staged_at, seq
LIMIT %(limit)s
FOR UPDATE SKIP LOCKED

-- name: mark_published
UPDATE {schema}.x_outbox SET published_at = coalesce(%(now)s::timestamptz, now())
WHERE published_at IS NULL AND id = ANY(%(ids)s::text[])

-- name: pending_count
SELECT count(*) FROM {schema}.x_outbox WHERE published_at IS NULL

-- name: prune
DELETE FROM {schema}.x_outbox
WHERE seq IN (
    SELECT seq FROM {schema}.x_outbox
    WHERE published_at IS NOT NULL AND published_at < %(before)s
    ORDER BY published_at
    LIMIT %(limit)s
)

-- Named queries of the SQLite outbox store (outboxes/sqlite.py). Each block starts with
-- `-- name:`. Times are INTEGER microseconds since the epoch, UTC. Rows are read in the order
-- of OutboxRecord/NewJob fields that the store unpacks by position.

-- name: migrations_table_exists
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'x_outbox_migrations';

-- name: migration_versions
SELECT version FROM x_outbox_migrations ORDER BY version;

-- name: migration_record
INSERT INTO x_outbox_migrations (version, applied_at)
VALUES (:version, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER));

-- name: table_exists
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'x_outbox';

-- name: stage
-- Positional, in this order, because executemany binds tuples fastest.
INSERT INTO x_outbox (id, job, queue, input, idempotency_key, max_attempts, priority, run_at,
                      staged_at, tenant_id, trace_context)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?);

-- name: claim
SELECT id, job, queue, input, idempotency_key, max_attempts, priority, run_at, staged_at,
       tenant_id, published_at, trace_context
FROM x_outbox
WHERE published_at IS NULL
ORDER BY staged_at, seq
LIMIT :limit;

-- name: mark_published
UPDATE x_outbox SET published_at = :now
WHERE published_at IS NULL AND id IN (SELECT value FROM json_each(:ids));

-- name: pending_count
SELECT count(*) FROM x_outbox WHERE published_at IS NULL;

-- name: prune
DELETE FROM x_outbox
WHERE seq IN (
    SELECT seq FROM x_outbox
    WHERE published_at IS NOT NULL AND published_at < :before
    ORDER BY published_at
    LIMIT :limit
);

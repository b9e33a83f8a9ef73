-- ultimat3-jobs SQLite schema, version 1: jobs and queue pause state.
--
-- Times are INTEGER microseconds since the Unix epoch, UTC. Ids are UUIDv7 text chosen by the
-- caller. tenant_id NULL means "no tenant"; '' is a tenant like any other.
-- Later features (leader, schedules, outbox) arrive as later numbered files; never edit this
-- one once released.

CREATE TABLE x_migrations (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
) STRICT;

CREATE TABLE x_jobs (
    id               TEXT    PRIMARY KEY,
    tenant_id        TEXT,
    name             TEXT    NOT NULL,
    queue            TEXT    NOT NULL,
    input            TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL,
    priority         INTEGER NOT NULL DEFAULT 0,
    state            TEXT    NOT NULL CHECK (state IN
                         ('scheduled', 'available', 'running', 'completed', 'dead', 'cancelled')),
    attempt          INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,
    created_at       INTEGER NOT NULL,
    attempted_at     INTEGER,
    finished_at      INTEGER,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    worker_id        TEXT,
    errors           TEXT    NOT NULL DEFAULT '[]',  -- JSON array of AttemptError.to_json()
    cancel_reason    TEXT
) STRICT;

-- Dedupe is enforced here, never by check-then-insert. A unique index treats NULLs as distinct,
-- so the "no tenant" NULL is indexed as (true, '') and a tenant '' as (false, ''): one index,
-- every row in it once. INSERT ... ON CONFLICT must name these three expressions exactly.
CREATE UNIQUE INDEX x_jobs_idempotency
    ON x_jobs (idempotency_key, tenant_id IS NULL, ifnull(tenant_id, ''));

-- Claims walk one queue in claim order and stop after LIMIT rows; only waiting rows are indexed,
-- so finished rows cost the claim nothing.
CREATE INDEX x_jobs_claim ON x_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('scheduled', 'available');

-- The rescuer looks for expired leases among running rows only.
CREATE INDEX x_jobs_lease ON x_jobs (lease_expires_at, id) WHERE state = 'running';

-- Pruning finds rows of some final states that finished before a cutoff.
CREATE INDEX x_jobs_finished ON x_jobs (state, finished_at) WHERE finished_at IS NOT NULL;

-- A queue appears here once paused or resumed; absent means not paused.
CREATE TABLE x_queues (
    name       TEXT    PRIMARY KEY,
    paused     INTEGER NOT NULL DEFAULT 0 CHECK (paused IN (0, 1)),
    updated_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

-- ultimat3-jobs outbox, SQLite, version 1: the x_outbox table in YOUR database (the one your
-- business transactions run on), and its migration ledger.
--
-- One row per staged job (seed SQL_OUTBOX_TABLE), plus what a job row needs: its id (fixed at
-- staging, so a re-publish collapses), priority, and the input as the exact JSON text. Times
-- are INTEGER microseconds since the Unix epoch, UTC; run_at NULL means "as soon as published".

CREATE TABLE x_outbox_migrations (
    version    INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
) STRICT;

CREATE TABLE x_outbox (
    seq             INTEGER PRIMARY KEY,           -- staging order among equal staged_at
    id              TEXT    NOT NULL UNIQUE,       -- the job's id
    job             TEXT    NOT NULL,
    queue           TEXT    NOT NULL DEFAULT 'default',
    input           TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    max_attempts    INTEGER NOT NULL DEFAULT 3,
    priority        INTEGER NOT NULL DEFAULT 0,
    run_at          INTEGER,
    staged_at       INTEGER NOT NULL,
    tenant_id       TEXT,
    published_at    INTEGER
) STRICT;

-- The relay's work queue: only unpublished rows are indexed.
CREATE INDEX x_outbox_unpublished ON x_outbox (staged_at, seq) WHERE published_at IS NULL;

-- Pruning finds published rows by age.
CREATE INDEX x_outbox_published ON x_outbox (published_at) WHERE published_at IS NOT NULL;

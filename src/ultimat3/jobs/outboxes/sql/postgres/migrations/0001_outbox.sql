-- ultimat3-jobs outbox, PostgreSQL, version 1: the x_outbox table in YOUR database (the one
-- your business transactions run on), and its migration ledger.
--
-- {schema} stands for the quoted schema identifier (default "ultimat3_jobs"), validated
-- against ^[a-z_][a-z0-9_]{0,62}$ and substituted before running.
--
-- One row per staged job (seed SQL_OUTBOX_TABLE), plus what a job row needs: its id (fixed at
-- staging, so a re-publish collapses), priority, and the input. `input` is `json`, not the
-- seed's `jsonb`: json keeps the caller's text byte for byte, as the job table does.
-- run_at NULL means "as soon as published".

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.x_outbox_migrations (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.x_outbox (
    seq             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id              text COLLATE "C" NOT NULL UNIQUE,
    job             text        NOT NULL,
    queue           text        NOT NULL DEFAULT 'default',
    input           json        NOT NULL,
    idempotency_key text        NOT NULL,
    max_attempts    integer     NOT NULL DEFAULT 3,
    priority        integer     NOT NULL DEFAULT 0,
    run_at          timestamptz,
    staged_at       timestamptz NOT NULL DEFAULT now(),
    tenant_id       text,
    published_at    timestamptz
);

-- The relay's work queue: only unpublished rows are indexed.
CREATE INDEX x_outbox_unpublished_idx
    ON {schema}.x_outbox (staged_at, seq) WHERE published_at IS NULL;

-- Pruning finds published rows by age.
CREATE INDEX x_outbox_published_idx
    ON {schema}.x_outbox (published_at) WHERE published_at IS NOT NULL;

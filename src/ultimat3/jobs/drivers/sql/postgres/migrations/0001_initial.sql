-- 0001: jobs, queues and the migration ledger.
--
-- {schema} stands for the quoted schema identifier (default "ultimat3_jobs"); the driver
-- validates the name against ^[a-z_][a-z0-9_]{0,62}$ and substitutes it before running, and
-- `ultimat3-jobs migrate --sql` prints the substituted text.
--
-- Text columns that are compared, ordered or indexed use COLLATE "C": ids are UUIDv7 text whose
-- byte order is their time order, and byte comparison is both faster and locale-independent.
-- `input` is `json`, not `jsonb`: json keeps the caller's text byte for byte (key order,
-- spacing, \u0000 escapes), which the records promise; jsonb would re-order keys.

CREATE SCHEMA IF NOT EXISTS {schema};

CREATE TABLE IF NOT EXISTS {schema}.x_migrations (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.x_jobs (
    id               text COLLATE "C" PRIMARY KEY,
    name             text COLLATE "C" NOT NULL,
    queue            text COLLATE "C" NOT NULL,
    tenant_id        text COLLATE "C",  -- NULL: no tenant ('' is a tenant like any other)
    idempotency_key  text COLLATE "C" NOT NULL,
    state            text COLLATE "C" NOT NULL,
    priority         integer     NOT NULL DEFAULT 0,
    attempt          integer     NOT NULL DEFAULT 0,
    max_attempts     integer     NOT NULL,
    run_at           timestamptz NOT NULL,
    created_at       timestamptz NOT NULL,
    attempted_at     timestamptz,
    finished_at      timestamptz,
    lease_expires_at timestamptz,
    lease_token      text,
    worker_id        text,
    cancel_reason    text,
    errors           jsonb       NOT NULL DEFAULT '[]',
    input            json        NOT NULL,
    CONSTRAINT x_jobs_state_check CHECK (
        state IN ('scheduled', 'available', 'running', 'completed', 'dead', 'cancelled')
    ),
    -- A lease exists exactly while the job runs: fencing relies on it.
    CONSTRAINT x_jobs_lease_check CHECK (
        (state = 'running') = (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL)
    )
);

-- Dedupe: one stored row per (tenant, key); pruning a row frees its key. Jobs without a tenant
-- must dedupe with each other, yet NULL never equals NULL in a unique index, so the index is on
-- an injective encoding of the tenant: NULL -> '', 'acme' -> '=acme' (and '' -> '='). This
-- works on every supported server (UNIQUE NULLS NOT DISTINCT would need PostgreSQL 15).
CREATE UNIQUE INDEX x_jobs_idempotency_key_idx
    ON {schema}.x_jobs ((coalesce('=' || tenant_id, '')), idempotency_key);

-- Claims walk this in claim order, per queue; finished rows never enter it, so a large backlog
-- of completed jobs costs a claim nothing.
CREATE INDEX x_jobs_claim_idx ON {schema}.x_jobs (queue, priority DESC, run_at, id)
    WHERE state IN ('scheduled', 'available');

-- The rescuer's "expired leases, oldest first".
CREATE INDEX x_jobs_lease_expiry_idx ON {schema}.x_jobs (lease_expires_at)
    WHERE state = 'running';

-- The pruner's "finished before"; finished_at is set exactly in the final states.
CREATE INDEX x_jobs_finished_idx ON {schema}.x_jobs (finished_at)
    WHERE finished_at IS NOT NULL;

CREATE TABLE {schema}.x_queues (
    name       text COLLATE "C" PRIMARY KEY,
    paused     boolean     NOT NULL DEFAULT false,
    updated_at timestamptz NOT NULL DEFAULT now()
);

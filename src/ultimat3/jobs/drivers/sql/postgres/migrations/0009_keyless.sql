-- 0009: jobs without a caller's key leave the idempotency index.
--
-- A job enqueued without an idempotency key keeps its id as its key (the column reads as
-- before), but the unique index now holds only the keys callers gave: a re-published keyless
-- job is refused by the primary key, which it already has. Every write of a row (its claim, its
-- outcome: each a new row version, since they change indexed columns) added an entry to every
-- index whose predicate held; keyless rows, most rows, now add one less. Inserts name no
-- conflict target (ON CONFLICT DO NOTHING), so both the key and the id dedupe.

CREATE UNIQUE INDEX x_jobs_idempotency_keyed_idx
    ON {schema}.x_jobs ((coalesce('=' || tenant_id, '')), idempotency_key)
    WHERE idempotency_key <> id;
DROP INDEX {schema}.x_jobs_idempotency_key_idx;

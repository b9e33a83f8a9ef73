-- ultimat3-jobs SQLite schema, version 9: jobs without a caller's key leave the idempotency
-- index.
--
-- A job enqueued without an idempotency key keeps its id as its key (the column reads as
-- before), but the unique index now holds only the keys callers gave: a re-published keyless
-- job is refused by its primary key. An insert is one b-tree write less for most jobs. INSERT
-- ... ON CONFLICT must repeat the index's expressions and predicate word for word, and names
-- the id as a second target.

CREATE UNIQUE INDEX x_jobs_idempotency_keyed
    ON x_jobs (idempotency_key, tenant_id IS NULL, ifnull(tenant_id, ''))
    WHERE idempotency_key <> id;
DROP INDEX x_jobs_idempotency;

-- Named statements of the SQLite plumbing the job driver and the outbox store share
-- (dialects/sqlite.py): connection set-up, transaction control, inspection of a caller's
-- connection. Each block starts with `-- name:`. The statements a driver's connection sends
-- inside a caller's transaction carry no comment of their own: the caller's tracing sees them
-- as written.
--
-- `begin` opens a read transaction (its reads agree); `begin_immediate` every write
-- transaction of ours (the write lock before any read: no read-to-write upgrade). One name
-- serves every savepoint of ours: they nest strictly, and ROLLBACK TO and RELEASE act on the
-- innermost savepoint of that name. `journal_size_limit` truncates the WAL back to 64 MiB
-- after a checkpoint, so one burst keeps no big file.

-- name: begin
BEGIN;

-- name: begin_immediate
BEGIN IMMEDIATE;

-- name: commit
COMMIT;

-- name: rollback
ROLLBACK;

-- name: savepoint
SAVEPOINT ultimat3_jobs;

-- name: savepoint_rollback
ROLLBACK TO ultimat3_jobs;

-- name: savepoint_release
RELEASE ultimat3_jobs;

-- name: journal_wal
PRAGMA journal_mode=WAL;

-- name: journal_size_limit
PRAGMA journal_size_limit=67108864;

-- name: synchronous_off
PRAGMA synchronous=OFF;

-- name: synchronous_normal
PRAGMA synchronous=NORMAL;

-- name: synchronous_full
PRAGMA synchronous=FULL;

-- name: synchronous_extra
PRAGMA synchronous=EXTRA;

-- name: database_list
PRAGMA database_list;

-- name: probe_text
-- A column declared TEXT (sqlite_schema.type), read to see whether a converter applies.
SELECT type FROM sqlite_schema LIMIT 1;

-- name: probe_integer
-- A column declared INTEGER, once the job file is migrated.
SELECT version FROM x_migrations LIMIT 1;

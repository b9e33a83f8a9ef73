-- ultimat3-jobs SQLite schema, version 2: cron schedule state and leader leases.

-- One row per cron task: when a scheduler first knew it (nothing is owed before that), and the
-- last occurrence dispatched. last_fired_at only moves forward (compare-and-set in the same
-- transaction as the occurrence's jobs), which is what makes a fire happen exactly once.
CREATE TABLE x_schedules (
    task          TEXT    PRIMARY KEY,
    first_seen_at INTEGER NOT NULL,
    last_fired_at INTEGER
) STRICT, WITHOUT ROWID;

-- One row per leadership (e.g. "scheduler"): who holds it and until when.
CREATE TABLE x_leaders (
    name       TEXT    PRIMARY KEY,
    holder     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL
) STRICT, WITHOUT ROWID;

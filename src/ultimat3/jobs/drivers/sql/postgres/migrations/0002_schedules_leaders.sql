-- 0002: cron schedule state and leader leases. ({schema}: see 0001.)

-- One row per cron task: nothing is owed before first_seen_at, and last_fired_at only moves
-- forward (compare-and-set in the same transaction that inserts the occurrence's jobs).
CREATE TABLE {schema}.x_schedules (
    task          text COLLATE "C" PRIMARY KEY,
    first_seen_at timestamptz NOT NULL,
    last_fired_at timestamptz
);

-- One row per leadership: held by `holder` until expires_at, on the database clock.
CREATE TABLE {schema}.x_leaders (
    name       text COLLATE "C" PRIMARY KEY,
    holder     text        NOT NULL,
    elected_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

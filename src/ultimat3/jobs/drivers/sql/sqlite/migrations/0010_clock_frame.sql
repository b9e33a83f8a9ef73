-- The host clock's frame last seen by a write (clock.Frame): its boot id and wall time minus
-- CLOCK_BOOTTIME, in microseconds. Every write transaction of the driver compares it with the
-- frame it reads under the write lock; a change over a second is a step of the host's wall
-- clock, and the stored future times (due times, lease expiries) move by it, once per file.
-- One row at most (id = 1).
CREATE TABLE x_clock (
    id         INTEGER PRIMARY KEY CHECK (id = 1),
    boot       TEXT    NOT NULL,
    "offset"   INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

-- Named queries of the SQLite driver (drivers/sqlite.py). Each block starts with `-- name:`.
--
-- Every statement that reads or returns a whole job lists the columns in the order of
-- records.Job; the driver unpacks rows by position. Times are INTEGER microseconds since the
-- epoch, UTC. A JSON array bound as text stands in for a list of values (json_each), so each
-- query keeps one fixed text however many values it takes.

-- name: migrations_table_exists
SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'x_migrations';

-- name: migration_versions
SELECT version FROM x_migrations ORDER BY version;

-- name: migration_record
INSERT INTO x_migrations (version, applied_at)
VALUES (:version, CAST((julianday('now') - 2440587.5) * 86400000000 AS INTEGER));

-- name: job_insert
-- Positional, in this order, because executemany binds tuples fastest. A caller's key dedupes
-- through x_jobs_idempotency_keyed (whose predicate is repeated here); a keyless job, whose key
-- is its id, through its primary key (migration 9).
INSERT INTO x_jobs (id, tenant_id, name, queue, input, idempotency_key, priority, state,
                    max_attempts, run_at, created_at, trace_context, limit_key, limit_max,
                    rate_max, rate_period)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (idempotency_key, tenant_id IS NULL, ifnull(tenant_id, ''))
    WHERE idempotency_key <> id DO NOTHING
ON CONFLICT (id) DO NOTHING;

-- name: job_insert_batch
-- A batch of jobs that share every field but their id, input, key, trace context and limit
-- key (one enqueue_many): those come as one JSON array of [id, input] or [id, input, key or
-- null for the id, trace context, limit key] rows, the rest bound once. SQLite walks the
-- array in C, about twice as fast as an executemany of job_insert, which binds sixteen
-- values a row. `WHERE true`: an upsert after SELECT ... FROM needs it, or its ON reads as a
-- join's.
INSERT INTO x_jobs (id, tenant_id, name, queue, input, idempotency_key, priority, state,
                    max_attempts, run_at, created_at, trace_context, limit_key, limit_max,
                    rate_max, rate_period)
SELECT json_extract(r.value, '$[0]'), :tenant_id, :name, :queue, json_extract(r.value, '$[1]'),
       ifnull(json_extract(r.value, '$[2]'), json_extract(r.value, '$[0]')), :priority,
       :state, :max_attempts, :run_at, :created_at, json_extract(r.value, '$[3]'),
       json_extract(r.value, '$[4]'), :limit_max, :rate_max, :rate_period
FROM json_each(:rows) AS r
WHERE true
ON CONFLICT (idempotency_key, tenant_id IS NULL, ifnull(tenant_id, ''))
    WHERE idempotency_key <> id DO NOTHING
ON CONFLICT (id) DO NOTHING;

-- name: job_insert_unique
-- job_insert for a job with a uniqueness window (limits.Unique): a second conflict target, the
-- partial index x_jobs_unique, whose predicate is repeated here word for word.
INSERT INTO x_jobs (id, tenant_id, name, queue, input, idempotency_key, priority, state,
                    max_attempts, run_at, created_at, trace_context, limit_key, limit_max,
                    rate_max, rate_period, unique_key, unique_states)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (idempotency_key, tenant_id IS NULL, ifnull(tenant_id, ''))
    WHERE idempotency_key <> id DO NOTHING
ON CONFLICT (id) DO NOTHING
ON CONFLICT (unique_key)
    WHERE unique_key IS NOT NULL
      AND (unique_states & CASE state WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2
                                      WHEN 'running' THEN 4 WHEN 'completed' THEN 8
                                      WHEN 'dead' THEN 16 ELSE 32 END) <> 0
DO NOTHING;

-- name: job_unique_holder
-- The job holding a unique key: read in the insert's write transaction, so nothing moves
-- between the refused insert and this read.
SELECT id FROM x_jobs
WHERE unique_key = :key
  AND unique_key IS NOT NULL
  AND (unique_states & CASE state WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2
                                  WHEN 'running' THEN 4 WHEN 'completed' THEN 8
                                  WHEN 'dead' THEN 16 ELSE 32 END) <> 0;

-- name: job_debounce
-- on_conflict="replace": the waiting holder takes the new input, run_at and priority.
UPDATE x_jobs
SET input = :input,
    run_at = :run_at,
    priority = :priority,
    state = CASE WHEN :run_at > :now THEN 'scheduled' ELSE 'available' END
WHERE id = :id AND state IN ('scheduled', 'available');

-- name: job_counts_add
-- The driver counts what it inserted (see migration 5): one row per (queue, state).
INSERT INTO x_job_counts (queue, state, n) VALUES (?, ?, ?)
ON CONFLICT (queue, state) DO UPDATE SET n = n + excluded.n;

-- name: job_id_by_key
-- A caller's key: the predicate of x_jobs_idempotency_keyed, repeated so the index serves.
SELECT id FROM x_jobs
WHERE idempotency_key = :key AND tenant_id IS :tenant_id AND idempotency_key <> id;

-- name: job_key_by_id
-- Who holds an id: a keyless job stored before (its key is its id), or one under another key.
SELECT idempotency_key FROM x_jobs WHERE id = :id;

-- name: job_claim_queue
-- One queue: the partial index x_jobs_claim yields rows in claim order, so the inner SELECT
-- stops after :limit rows however long the backlog. Each job's lease token is the claim's
-- random :token plus its id: fresh for every claim, and different for every job of a batch.
UPDATE x_jobs
SET state = 'running',
    attempt = attempt + 1,
    attempted_at = :now,
    lease_token = :token || '.' || id,
    lease_expires_at = :expires_at,
    worker_id = :worker_id,
    started = 1
WHERE id IN (
    SELECT id FROM x_jobs
    WHERE queue = :queue
      AND state IN ('scheduled', 'available')
      AND run_at <= :now
      AND isolated = 0
      AND limit_key IS NULL  -- jobs with a concurrency limit: job_limit_next below
      AND NOT EXISTS (SELECT 1 FROM x_queues WHERE name = :queue AND paused = 1)
    ORDER BY priority DESC, run_at, id
    LIMIT :limit
)
RETURNING id, name, queue, input, tenant_id, idempotency_key, priority, state, attempt,
          max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
          lease_expires_at, worker_id, errors, cancel_reason, trace_context, result;

-- name: queue_paused_among
SELECT name FROM x_queues
WHERE paused = 1 AND name IN (SELECT value FROM json_each(:queues));

-- name: job_claim_candidates
-- Several queues: the best :limit of each queue, merged in Python, then claimed by id.
-- :isolated picks ordinary jobs (0) or isolated ones (1), each from its own partial index.
-- :skip is a JSON array of job names this worker lacks (ClaimParams.skip), usually empty.
SELECT id, priority, run_at FROM x_jobs
WHERE queue = :queue
  AND state IN ('scheduled', 'available')
  AND run_at <= :now
  AND isolated = :isolated
  AND limit_key IS NULL
  AND name NOT IN (SELECT value FROM json_each(:skip))
  AND NOT EXISTS (SELECT 1 FROM x_queues WHERE name = :queue AND paused = 1)
ORDER BY priority DESC, run_at, id
LIMIT :limit;

-- name: job_limit_keys
-- A claim with limits (ultimat3/jobs/limits.py): the keys with a due job in the queue, from
-- the one after :after (up to :upto when not NULL: the second pass of a wrap), one seek of
-- x_jobs_claim_limited per key, at most :keys of them; each with its head job's limits, how
-- many of its jobs hold a slot (running, lease not expired), and under a rate limit its starts
-- within the window and the oldest one. A co-routine: the driver stops reading once it has
-- enough keys with a free slot, and the recursion stops with it. Exact: the claim holds the
-- write lock.
WITH RECURSIVE keys(k, n) AS (
    SELECT (SELECT limit_key FROM x_jobs
            WHERE queue = :queue AND state IN ('scheduled', 'available')
              AND limit_key IS NOT NULL AND limit_key > :after
              AND run_at <= :now AND isolated = :isolated
            ORDER BY limit_key LIMIT 1),
           1
    WHERE NOT EXISTS (SELECT 1 FROM x_queues WHERE name = :queue AND paused = 1)
    UNION ALL
    SELECT (SELECT j.limit_key FROM x_jobs j
            WHERE j.queue = :queue AND j.state IN ('scheduled', 'available')
              AND j.limit_key IS NOT NULL AND j.limit_key > keys.k
              AND j.run_at <= :now AND j.isolated = :isolated
            ORDER BY j.limit_key LIMIT 1),
           keys.n + 1
    FROM keys
    WHERE keys.k IS NOT NULL AND keys.n < :keys AND (:upto IS NULL OR keys.k <= :upto)
)
-- With :plain, a first row (no key) holds the queue's first :limit unlimited due jobs, so that
-- the claim needs no statement of its own for them.
SELECT NULL, 0, 0, 0, 0, 0, NULL,
       (SELECT json_group_array(json_array(c.id, c.priority, c.run_at)) FROM (
            SELECT id, priority, run_at FROM x_jobs
            WHERE queue = :queue AND state IN ('scheduled', 'available')
              AND run_at <= :now AND isolated = :isolated AND limit_key IS NULL
              AND name NOT IN (SELECT value FROM json_each(:skip))
            ORDER BY priority DESC, run_at, id
            LIMIT :limit) c)
WHERE :plain AND NOT EXISTS (SELECT 1 FROM x_queues WHERE name = :queue AND paused = 1)
UNION ALL
SELECT keys.k, h.limit_max,
       (SELECT count(*) FROM x_jobs r
        WHERE r.limit_key = keys.k AND r.state = 'running' AND r.lease_expires_at > :now),
       h.rate_max, h.rate_period,
       CASE WHEN h.rate_max > 0 THEN
           (SELECT count(*) FROM x_jobs r
            WHERE r.limit_key = keys.k AND r.attempted_at IS NOT NULL AND r.rate_max > 0
              AND r.attempted_at > :now - h.rate_period)
       ELSE 0 END,
       CASE WHEN h.rate_max > 0 THEN
           (SELECT min(r.attempted_at) FROM x_jobs r
            WHERE r.limit_key = keys.k AND r.attempted_at IS NOT NULL AND r.rate_max > 0
              AND r.attempted_at > :now - h.rate_period)
       END,
       -- Its first :limit due jobs in claim order, as [[id, priority, run_at], ...], unless its
       -- slots are all held (the driver takes as many as are free and still needed).
       CASE WHEN (SELECT count(*) FROM x_jobs r
                  WHERE r.limit_key = keys.k AND r.state = 'running'
                    AND r.lease_expires_at > :now) < h.limit_max THEN
           (SELECT json_group_array(json_array(c.id, c.priority, c.run_at)) FROM (
                SELECT id, priority, run_at FROM x_jobs
                WHERE queue = :queue AND limit_key = keys.k
                  AND state IN ('scheduled', 'available')
                  AND run_at <= :now AND isolated = :isolated
                  AND name NOT IN (SELECT value FROM json_each(:skip))
                ORDER BY priority DESC, run_at, id
                LIMIT :limit) c)
       END
FROM keys
CROSS JOIN x_jobs h ON h.id = (  -- the key's head job (CROSS: keys stays outer, lazy)
    SELECT x.id FROM x_jobs x
    WHERE x.queue = :queue AND x.limit_key = keys.k AND x.state IN ('scheduled', 'available')
    ORDER BY x.priority DESC, x.run_at, x.id LIMIT 1
)
WHERE keys.k IS NOT NULL AND (:upto IS NULL OR keys.k <= :upto);

-- name: job_flow
-- Where a job's partition stands (Driver.job_flow): job_limit_keys's counts, for one job.
SELECT j.limit_key, j.limit_max,
       (SELECT count(*) FROM x_jobs r
        WHERE r.limit_key = j.limit_key AND r.state = 'running' AND r.lease_expires_at > :now),
       j.rate_max, j.rate_period,
       (SELECT count(*) FROM x_jobs r
        WHERE j.rate_max > 0 AND r.limit_key = j.limit_key
          AND r.attempted_at IS NOT NULL AND r.rate_max > 0
          AND r.attempted_at > :now - j.rate_period),
       (SELECT min(r.attempted_at) FROM x_jobs r
        WHERE j.rate_max > 0 AND r.limit_key = j.limit_key
          AND r.attempted_at IS NOT NULL AND r.rate_max > 0
          AND r.attempted_at > :now - j.rate_period)
FROM x_jobs j
WHERE j.id = :id AND j.limit_key IS NOT NULL;

-- name: job_peek_isolated
SELECT 1 FROM x_jobs
WHERE isolated = 1
  AND state IN ('scheduled', 'available')
  AND run_at <= :now
  AND queue IN (SELECT value FROM json_each(:queues))
  AND queue NOT IN (SELECT name FROM x_queues WHERE paused = 1)
LIMIT 1;

-- name: job_claim_ids
UPDATE x_jobs
SET state = 'running',
    attempt = attempt + 1,
    attempted_at = :now,
    lease_token = :token || '.' || id,
    lease_expires_at = :expires_at,
    worker_id = :worker_id,
    started = 1
WHERE id IN (SELECT value FROM json_each(:ids))
  AND state IN ('scheduled', 'available')
RETURNING id, name, queue, input, tenant_id, idempotency_key, priority, state, attempt,
          max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
          lease_expires_at, worker_id, errors, cancel_reason, trace_context, result;

-- name: lease_extend
-- The fenced writes below are run once per lease (executemany).
UPDATE x_jobs
SET lease_expires_at = ?
WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: job_release_claim
-- The jobs of one claim whose reply its worker never got, found by the claim's :token (each
-- lease token is the token, a dot, the job's id). Back at once, attempt refunded.
UPDATE x_jobs
SET state = 'available',
    run_at = :now,
    attempt = max(attempt - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    started = 0
WHERE state = 'running'
  AND substr(lease_token, 1, length(:token) + 1) = :token || '.'
RETURNING id;

-- name: job_complete
-- The result is the handler's return value as JSON text, NULL for None.
UPDATE x_jobs
SET state = 'completed',
    finished_at = ?,
    result = ?,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = ? AND lease_token = ? AND state = 'running';

-- name: job_fail
-- :retry_at (:now plus the failure's retry_in) NULL parks the job as dead; :error is one AttemptError.to_json() object;
-- :isolated says whether the job is isolated from now on (a rescue) or not (any other failure);
-- :refund (1) gives the attempt back (a rescue of a job that ran beside others).
UPDATE x_jobs
SET state = CASE
        WHEN :retry_at IS NULL THEN 'dead'
        WHEN :retry_at > :now THEN 'scheduled'
        ELSE 'available'
    END,
    run_at = coalesce(:retry_at, run_at),
    finished_at = CASE WHEN :retry_at IS NULL THEN :now END,
    errors = json_insert(errors, '$[#]', json(:error)),
    attempt = max(attempt - :refund, 0),
    lease_token = NULL,
    lease_expires_at = NULL,
    isolated = :isolated
WHERE id = :id AND lease_token = :token AND state = 'running';

-- name: job_snooze
-- :run_at NULL keeps the job's due time (a release that keeps its place).
UPDATE x_jobs
SET state = CASE WHEN coalesce(:run_at, run_at) > :now THEN 'scheduled' ELSE 'available' END,
    run_at = coalesce(:run_at, run_at),
    attempt = max(attempt - 1, 0),
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = :id AND lease_token = :token AND state = 'running';

-- name: job_cancel
UPDATE x_jobs
SET state = 'cancelled',
    finished_at = :now,
    cancel_reason = :reason,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = :id
  AND state IN ('scheduled', 'available', 'running')
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id);

-- name: job_cancel_leased
UPDATE x_jobs
SET state = 'cancelled',
    finished_at = :now,
    cancel_reason = :reason,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE id = :id
  AND lease_token = :token
  AND state = 'running'
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id);

-- name: job_list_expired
-- Started jobs only (every claim marks its jobs started; a claim whose reply was lost is
-- released by job_release_claim). :isolated
-- NULL lists every one, 1 those that ran alone (isolated), 0 those that ran beside others.
SELECT id, name, queue, input, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors, cancel_reason, trace_context, result
FROM x_jobs
WHERE state = 'running' AND lease_expires_at < :now AND started = 1
  AND (:isolated IS NULL OR isolated = :isolated)
ORDER BY lease_expires_at, id
LIMIT :limit;

-- name: job_list_running
-- Every running job, on the lease index (which holds running rows only).
SELECT id, name, queue, input, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors, cancel_reason, trace_context, result
FROM x_jobs
WHERE state = 'running'
ORDER BY lease_expires_at, id
LIMIT :limit;

-- name: job_get
SELECT id, name, queue, input, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors, cancel_reason, trace_context, result
FROM x_jobs
WHERE id = :id AND (:tenant_id IS NULL OR tenant_id = :tenant_id);

-- name: job_list
-- Each filter is NULL for "any"; :states and :ids are JSON arrays. The id bounds are written
-- so the planner seeks the primary key (any text sorts below any blob, above ''), where an
-- "IS NULL OR" form would walk it from the top on every page.
SELECT id, name, queue, input, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors, cancel_reason, trace_context, result
FROM x_jobs
WHERE (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:queue IS NULL OR queue = :queue)
  AND (:name IS NULL OR name = :name)
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND id < coalesce(:before_id, x'')
  AND id >= coalesce(:min_id, '')
ORDER BY id DESC
LIMIT :limit;

-- name: job_id_below
-- The id :offset places below :before_id, newest first: a count along the primary key index.
SELECT id FROM x_jobs
WHERE id < coalesce(:before_id, x'')
ORDER BY id DESC
LIMIT 1 OFFSET :offset;

-- name: job_count
SELECT queue, state, count(*)
FROM x_jobs
WHERE (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:queue IS NULL OR queue = :queue)
  AND (:name IS NULL OR name = :name)
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id)
  AND (:ids IS NULL OR id IN (SELECT value FROM json_each(:ids)))
  AND id >= coalesce(:min_id, '')
GROUP BY queue, state;

-- name: job_count_tenant
-- One tenant's counts, from x_jobs_tenant (covering while the other filters are unset).
SELECT queue, state, count(*)
FROM x_jobs
WHERE tenant_id = :tenant_id
GROUP BY queue, state;

-- name: job_retry
UPDATE x_jobs
SET state = 'available',
    run_at = :now,
    finished_at = NULL,
    cancel_reason = NULL,
    max_attempts = max(max_attempts, attempt + 1)
WHERE id IN (SELECT value FROM json_each(:ids))
  AND state IN ('dead', 'cancelled')
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id)
RETURNING id;

-- name: job_discard
DELETE FROM x_jobs
WHERE id IN (SELECT value FROM json_each(:ids))
  AND state IN ('dead', 'cancelled')
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id)
RETURNING id;

-- name: job_prune
-- Any rows finished before the cutoff qualify; no ORDER BY, so no sort of the whole backlog.
DELETE FROM x_jobs
WHERE id IN (
    SELECT id FROM x_jobs
    WHERE state IN (SELECT value FROM json_each(:states))
      AND state IN ('completed', 'dead', 'cancelled')
      AND finished_at < :finished_before
    LIMIT :limit
);

-- name: job_finished_counts
-- A range of the finished index per final state; k is the bucket index from :since.
SELECT queue, state, (finished_at - :since) / :bucket AS k, count(*)
FROM x_jobs
WHERE state IN ('completed', 'dead', 'cancelled')
  AND finished_at IS NOT NULL AND finished_at >= :since
  AND (:tenant_id IS NULL OR tenant_id = :tenant_id)
GROUP BY queue, state, k;

-- name: queue_set_paused
INSERT INTO x_queues (name, paused, updated_at)
VALUES (:name, :paused, :now)
ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at;

-- name: queue_counts
-- Kept by the triggers of migration 5: a few rows, however many jobs.
SELECT queue, state, n FROM x_job_counts WHERE n <> 0;

-- name: job_count_kept
-- job_count for a filter of states and queue only, from the kept counts.
SELECT queue, state, n FROM x_job_counts
WHERE n <> 0
  AND (:states IS NULL OR state IN (SELECT value FROM json_each(:states)))
  AND (:queue IS NULL OR queue = :queue);

-- name: queue_first
-- The oldest ready job of each queue is found on the claim index x_jobs_claim (queue,
-- priority DESC, run_at, id), no index of its own (one that led with run_at would tempt the
-- planner away from it for claims): the driver walks the (queue, priority) groups with
-- these probes, each a seek, and the first row of a group has its smallest run_at. The claim
-- index holds unlimited jobs only (limit_key IS NULL, migration 6): without that term the
-- probes match no index and walk the table. Limited jobs: queue_oldest_limited.
SELECT queue, max(priority) FROM x_jobs
WHERE state IN ('scheduled', 'available') AND limit_key IS NULL
  AND queue = (SELECT min(queue) FROM x_jobs
               WHERE state IN ('scheduled', 'available') AND limit_key IS NULL
                 AND queue > :after);

-- name: queue_next_priority
SELECT max(priority) FROM x_jobs
WHERE queue = :queue AND state IN ('scheduled', 'available') AND limit_key IS NULL
  AND priority < :priority;

-- name: queue_group_first_run_at
SELECT min(run_at) FROM x_jobs
WHERE queue = :queue AND state IN ('scheduled', 'available') AND limit_key IS NULL
  AND priority = :priority;

-- name: queue_oldest_limited
-- The oldest due limited job per queue, on x_jobs_claim_limited: a walk of the waiting
-- limited jobs (those held back by their limits among them), not of the table.
SELECT queue, min(run_at) FROM x_jobs
WHERE state IN ('scheduled', 'available') AND limit_key IS NOT NULL AND run_at <= :now
GROUP BY queue;

-- name: queue_settings
SELECT name, paused FROM x_queues;

-- name: data_version
PRAGMA data_version;

-- name: schedule_touch
INSERT INTO x_schedules (task, first_seen_at) VALUES (:task, :now)
ON CONFLICT (task) DO NOTHING;

-- name: schedule_get
SELECT task, first_seen_at, last_fired_at FROM x_schedules
WHERE task IN (SELECT value FROM json_each(:tasks));

-- name: schedule_advance
-- Compare-and-set: only a later occurrence moves the state; zero rows means already fired.
INSERT INTO x_schedules (task, first_seen_at, last_fired_at) VALUES (:task, :now, :at)
ON CONFLICT (task) DO UPDATE SET last_fired_at = excluded.last_fired_at
WHERE x_schedules.last_fired_at IS NULL OR x_schedules.last_fired_at < excluded.last_fired_at;

-- name: schedule_rewind
-- The repair of a last-fired time in the future (the clock stepped back): compare-and-set.
UPDATE x_schedules SET last_fired_at = :to WHERE task = :task AND last_fired_at = :was;

-- name: leader_elect
INSERT INTO x_leaders (name, holder, expires_at) VALUES (:name, :holder, :expires_at)
ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = excluded.expires_at
WHERE x_leaders.holder = excluded.holder OR x_leaders.expires_at <= :now;

-- name: leader_resign
DELETE FROM x_leaders WHERE name = :name AND holder = :holder;

-- name: worker_beat
INSERT INTO x_workers (id, host, pid, queues, concurrency, started_at, heartbeat_at, version)
VALUES (:id, :host, :pid, :queues, :concurrency, :started_at, :now, :version)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, queues = excluded.queues,
    concurrency = excluded.concurrency, version = excluded.version;

-- name: worker_remove
DELETE FROM x_workers WHERE id = :id;

-- name: worker_prune
DELETE FROM x_workers WHERE heartbeat_at < :cutoff RETURNING id;

-- name: worker_list
SELECT id, host, pid, queues, concurrency, started_at, heartbeat_at, version
FROM x_workers ORDER BY id;

-- name: clock_frame
-- The frame of the host clock last seen (migration 10): a read of one row by its key.
SELECT boot, "offset" FROM x_clock WHERE id = 1;

-- name: clock_frame_set
INSERT INTO x_clock (id, boot, "offset", updated_at) VALUES (1, :boot, :offset, :now)
ON CONFLICT (id) DO UPDATE SET boot = excluded.boot, "offset" = excluded."offset",
    updated_at = excluded.updated_at;

-- name: clock_shift_jobs
-- A step of the host clock by :by microseconds (the driver's _align): the times still ahead
-- move with it, so each keeps its distance from now. A waiting job's due time (and a running
-- one's, which a release that keeps its place puts back), a running job's lease expiry, and a
-- rate-limited start still inside its window (limits count those against now). Finished
-- jobs' times, created_at and other starts are history: they stay as written.
UPDATE x_jobs
SET run_at = CASE WHEN state IN ('scheduled', 'available', 'running')
                  THEN run_at + :by ELSE run_at END,
    lease_expires_at = lease_expires_at + :by,
    attempted_at = CASE WHEN rate_max > 0 AND attempted_at > :now - :by - rate_period
                        THEN attempted_at + :by ELSE attempted_at END
WHERE state IN ('scheduled', 'available', 'running')
   OR (rate_max > 0 AND attempted_at > :now - :by - rate_period);

-- name: clock_shift_leaders
UPDATE x_leaders SET expires_at = expires_at + :by;

-- name: clock_shift_workers
-- A worker's last heartbeat is compared with now to prune the stale ones.
UPDATE x_workers SET heartbeat_at = heartbeat_at + :by;

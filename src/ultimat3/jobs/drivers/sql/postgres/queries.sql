-- Named queries of the PostgreSQL driver (see ultimat3/jobs/sql.py for the block format).
--
-- {schema} stands for the quoted, validated schema identifier, substituted once when the driver
-- starts; every value is a bound %(name)s parameter, except the integer {limit} of
-- job_claim_queue (see there). `coalesce(%(now)s, now())` lets the database clock decide
-- unless a caller pins the time. Lists arrive as one parameter each (a text[] literal, or a
-- JSON document for rows), so one statement serves one job or thousands. Wake-ups go out with
-- pg_notify(%(channel)s, queue): inside the statement's transaction, so only at commit.

-- name: migrate_lock
SELECT pg_advisory_xact_lock(%(key)s)

-- name: migrate_applied
SELECT version FROM {schema}.x_migrations ORDER BY version

-- name: migrate_has_ledger
-- Read from pg_class (an MVCC snapshot per statement), not to_regclass: its catalog cache may
-- still hold "no such table" from before another process's migration committed.
SELECT EXISTS (
    SELECT 1 FROM pg_catalog.pg_class c
    JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = %(schema)s AND c.relname = 'x_migrations'
)

-- name: server_identity
-- Two connections reach the same database when all three agree.
SELECT current_database(),
       (SELECT oid FROM pg_database WHERE datname = current_database()),
       pg_postmaster_start_time(),
       to_regclass(%(table)s) IS NOT NULL

-- name: job_insert
-- %(rows)s is a JSON array of rows, each [id, name, queue, input text, tenant, key, priority,
-- max_attempts, run_at, delay, limit_key, limit_max, rate_max, rate_period] (a delay counts
-- from now, on the database's clock): decoding it as jsonb costs the server less than binding
-- nine arrays
-- (and the client far less: psycopg dumps list parameters element by element in Python), and
-- positional rows cost less than objects, whose keys json_to_recordset hashes row by row.
WITH rows AS (
    SELECT e.ord,
           e.v ->> 0 AS id,
           e.v ->> 1 AS name,
           e.v ->> 2 AS queue,
           e.v ->> 3 AS input,
           e.v ->> 4 AS tenant_id,
           e.v ->> 5 AS idempotency_key,
           (e.v ->> 6)::int AS priority,
           (e.v ->> 7)::int AS max_attempts,
           coalesce((e.v ->> 8)::timestamptz,
                    coalesce(%(now)s::timestamptz, now()) + (e.v ->> 9)::interval) AS run_at,
           e.v ->> 10 AS trace_context,
           e.v ->> 11 AS limit_key,
           coalesce((e.v ->> 12)::int, 0) AS limit_max,
           coalesce((e.v ->> 13)::int, 0) AS rate_max,
           coalesce((e.v ->> 14)::bigint, 0) AS rate_period
    FROM jsonb_array_elements(%(rows)s::jsonb) WITH ORDINALITY AS e(v, ord)
),
inserted AS (
    INSERT INTO {schema}.x_jobs AS j
        (id, name, queue, input, tenant_id, idempotency_key, priority, state,
         max_attempts, run_at, created_at, trace_context, limit_key, limit_max, rate_max,
         rate_period)
    SELECT r.id, r.name, r.queue, r.input::json, r.tenant_id, r.idempotency_key, r.priority,
           CASE WHEN r.run_at > coalesce(%(now)s::timestamptz, now())
                THEN 'scheduled' ELSE 'available' END,
           r.max_attempts,
           coalesce(r.run_at, %(now)s::timestamptz, now()),
           coalesce(%(now)s::timestamptz, now()),
           r.trace_context, r.limit_key, r.limit_max, r.rate_max, r.rate_period
    FROM rows r
    ORDER BY r.ord
    ON CONFLICT DO NOTHING  -- a caller's key, or the id of a keyless job (migration 9)
    RETURNING j.id, j.queue, j.state
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue)
    FROM (SELECT DISTINCT queue FROM inserted WHERE state = 'available') q
)
-- The sub-select makes the wake-ups run; it is evaluated once, if anything was inserted.
SELECT i.id, (SELECT count(*) FROM woken) FROM inserted i

-- name: job_insert_one
-- job_insert for one job, with plain parameters: no JSON to decode, no DISTINCT to sort. Most
-- enqueues are single jobs, and this statement costs little more than a bare INSERT. A delay
-- is added to the database's clock, never the enqueuing host's. Its DO NOTHING takes any
-- conflict: its idempotency key, its id, or its unique key held (see the driver's _insert).
WITH inserted AS (
    INSERT INTO {schema}.x_jobs AS j
        (id, name, queue, input, tenant_id, idempotency_key, priority, state,
         max_attempts, run_at, created_at, trace_context, limit_key, limit_max, rate_max,
         rate_period, unique_key, unique_states)
    VALUES (
        %(id)s, %(name)s, %(queue)s, %(input)s::json, %(tenant_id)s, %(key)s, %(priority)s,
        CASE WHEN coalesce(%(run_at)s::timestamptz,
                           coalesce(%(now)s::timestamptz, now()) + %(delay)s::interval)
                  > coalesce(%(now)s::timestamptz, now())
             THEN 'scheduled' ELSE 'available' END,
        %(max_attempts)s,
        coalesce(%(run_at)s::timestamptz,
                 coalesce(%(now)s::timestamptz, now()) + %(delay)s::interval,
                 %(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()),
        %(trace_context)s, %(limit_key)s, %(limit_max)s, %(rate_max)s, %(rate_period)s,
        %(unique_key)s, %(unique_states)s
    )
    ON CONFLICT DO NOTHING  -- a caller's key, or the id of a keyless job (migration 9)
    RETURNING j.id, j.queue, j.state
)
SELECT id, CASE WHEN state = 'available' THEN pg_notify(%(channel)s, queue) END FROM inserted

-- name: job_unique_holder
-- The job holding a unique key (limits.Unique): the predicate of x_jobs_unique_idx.
SELECT id FROM {schema}.x_jobs
WHERE unique_key = %(key)s
  AND unique_key IS NOT NULL
  AND (unique_states & CASE state WHEN 'scheduled' THEN 1 WHEN 'available' THEN 2
                                  WHEN 'running' THEN 4 WHEN 'completed' THEN 8
                                  WHEN 'dead' THEN 16 ELSE 32 END) <> 0

-- name: job_debounce
-- on_conflict="replace": the holder, if it still waits, takes the new input, run_at and
-- priority (a conditional write: a holder claimed meanwhile is left as it is).
WITH changed AS (
    UPDATE {schema}.x_jobs j
    SET input = %(input)s::json,
        priority = %(priority)s,
        run_at = coalesce(%(run_at)s::timestamptz,
                          coalesce(%(now)s::timestamptz, now()) + %(delay)s::interval,
                          %(now)s::timestamptz, now()),
        state = CASE WHEN coalesce(%(run_at)s::timestamptz,
                                   coalesce(%(now)s::timestamptz, now()) + %(delay)s::interval)
                          > coalesce(%(now)s::timestamptz, now())
                     THEN 'scheduled' ELSE 'available' END
    WHERE j.id = %(id)s AND j.state IN ('scheduled', 'available')
    RETURNING j.queue, j.state
)
SELECT count(*), count(CASE WHEN state = 'available' THEN pg_notify(%(channel)s, queue) END)
FROM changed

-- name: clock
SELECT coalesce(%(now)s::timestamptz, now())

-- name: job_copy
-- The bulk fast path: plain COPY, so the unique index refuses any duplicate key (the driver
-- then falls back to job_insert; so does a batch with limits or unique keys); every value,
-- times and states included, comes from the driver, which read the clock in the same
-- transaction.
COPY {schema}.x_jobs
    (id, name, queue, input, tenant_id, idempotency_key, priority, state,
     max_attempts, run_at, created_at)
FROM STDIN

-- name: notify_queues
SELECT pg_notify(%(channel)s, q.name) FROM unnest(%(queues)s::text[]) AS q(name)

-- name: job_ids_by_key
-- %(keys)s is a JSON array of {"t": tenant, "k": key, "i": id}: the stored row of each
-- caller's key, through x_jobs_idempotency_keyed_idx (its predicate repeated), and the row
-- holding each id, through the primary key, with its key: a keyless job's key is its id
-- (migration 9), so the same key there is the same job, another key an error.
WITH k AS (
    SELECT *
    FROM ROWS FROM (json_to_recordset(%(keys)s::json) AS (t text, k text, i text))
         WITH ORDINALITY AS k(tenant_id, idempotency_key, id, ord)
)
SELECT k.ord, j.id, NULL
FROM k
JOIN {schema}.x_jobs j
  ON coalesce('=' || j.tenant_id, '') = coalesce('=' || k.tenant_id, '')
 AND j.idempotency_key = k.idempotency_key
 AND j.idempotency_key <> j.id
WHERE k.idempotency_key <> k.id
UNION ALL
SELECT k.ord, j.id, j.idempotency_key
FROM k
JOIN {schema}.x_jobs j ON j.id = k.id

-- name: commit_relaxed
-- A worker's turn that only claims commits without waiting for the WAL flush (as `relaxed`
-- in job_claim); the first statement of its transaction.
SET LOCAL synchronous_commit = off

-- name: notify_probe
-- The pooler check's NOTIFY (see the driver's _check_pooler).
SELECT pg_notify(%(channel)s, %(payload)s)

-- name: session_ends
-- Both ends of this session's socket, as the server sees them (the pooler check's _direct).
SELECT host(client_addr), client_port, host(inet_server_addr()), inet_server_port()
FROM pg_stat_activity WHERE pid = pg_backend_pid()

-- name: ping
SELECT 1

-- name: job_claim
-- Per queue, the due jobs in claim order, locked without waiting (SKIP LOCKED: rows another
-- claim holds are passed over, never waited for); then the best `limit` across the queues.
-- The UPDATE finds them by `id = ANY(ARRAY(...))`, a primary-key probe per id whatever the
-- planner guesses about `limit`: a prepared statement's generic plan once chose a merge join
-- that walked the primary key through every finished row.
-- `relaxed`: the claim is a transaction alone and commits without waiting for the WAL flush
-- (synchronous_commit off for its own transaction): a claim lost in a crash only runs its
-- jobs once more (at least once, as always), and the next write of an outcome flushes it
-- anyway. The setting is read at commit, after the statement; the UPDATE's condition on
-- `relax` makes it run first.
WITH relax AS (
    SELECT CASE WHEN %(relaxed)s::boolean
                THEN set_config('synchronous_commit', 'off', true) ELSE '' END AS off
),
due AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {schema}.x_jobs j
        WHERE j.queue = q.name
          AND j.state IN ('scheduled', 'available')
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
          AND NOT j.isolated  -- isolated jobs: job_claim_isolated
          AND j.limit_key IS NULL  -- limited jobs: job_limit_lock, job_claim_limited
          AND j.name <> ALL(%(skip)s::text[])  -- names this worker lacks (ClaimParams.skip)
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.x_queues p WHERE p.name = q.name AND p.paused
    )
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
),
claimed AS (
    UPDATE {schema}.x_jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = coalesce(%(now)s::timestamptz, now()),
        lease_token = %(token)s || '.' || j.id,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease_for)s::interval,
        worker_id = %(worker_id)s,
        started = true  -- claimed in a worker's cycle: its handlers are free now
    WHERE j.id = ANY(ARRAY(SELECT id FROM due)) AND (SELECT off FROM relax) IS NOT NULL
    RETURNING j.id, j.name, j.queue, j.input::text, j.tenant_id, j.idempotency_key,
              j.priority, j.state, j.attempt, j.max_attempts, j.run_at, j.created_at,
              j.attempted_at, j.finished_at, j.lease_token, j.lease_expires_at, j.worker_id,
              j.errors::text, j.cancel_reason, j.trace_context, j.result::text
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id

-- name: job_claim_isolated
-- job_claim for isolated jobs (rescued after their worker died: see migration 3), planned
-- against their own partial index (x_jobs_isolated_idx).
WITH relax AS (
    SELECT CASE WHEN %(relaxed)s::boolean
                THEN set_config('synchronous_commit', 'off', true) ELSE '' END AS off
),
due AS (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {schema}.x_jobs j
        WHERE j.queue = q.name
          AND j.state IN ('scheduled', 'available')
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
          AND j.isolated
          AND j.limit_key IS NULL  -- limited jobs: job_limit_lock, job_claim_limited
          AND j.name <> ALL(%(skip)s::text[])  -- names this worker lacks (ClaimParams.skip)
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.x_queues p WHERE p.name = q.name AND p.paused
    )
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
),
claimed AS (
    UPDATE {schema}.x_jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = coalesce(%(now)s::timestamptz, now()),
        lease_token = %(token)s || '.' || j.id,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease_for)s::interval,
        worker_id = %(worker_id)s,
        started = true  -- claimed in a worker's cycle: its handlers are free now
    WHERE j.id = ANY(ARRAY(SELECT id FROM due)) AND (SELECT off FROM relax) IS NOT NULL
    RETURNING j.id, j.name, j.queue, j.input::text, j.tenant_id, j.idempotency_key,
              j.priority, j.state, j.attempt, j.max_attempts, j.run_at, j.created_at,
              j.attempted_at, j.finished_at, j.lease_token, j.lease_expires_at, j.worker_id,
              j.errors::text, j.cancel_reason, j.trace_context, j.result::text
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id

-- name: job_claim_queue
-- job_claim for one queue, the usual case, without the per-queue join. {limit} is an integer
-- the driver writes into the text (one prepared statement per limit, of which a worker uses
-- one or two): with LIMIT as a parameter PostgreSQL prices the generic plan so far above the
-- custom one that it would plan every execution again, which costs about as much as running
-- it. The uncorrelated NOT EXISTS runs once. With the LIMIT known, the UPDATE joins `due`
-- (at most {limit} rows): a primary-key probe per row, on a table never analyzed too, where
-- `id = ANY(ARRAY(...))` (10 ids guessed, against 10 pages) planned a scan of the table, and a
-- generic plan keeps it while the table grows (22 ms a claim at 100,000 rows). `relaxed`: as
-- in job_claim.
WITH relax AS (
    SELECT CASE WHEN %(relaxed)s::boolean
                THEN set_config('synchronous_commit', 'off', true) ELSE '' END AS off
),
due AS (
    SELECT j.id
    FROM {schema}.x_jobs j
    WHERE j.queue = %(queue)s
      AND j.state IN ('scheduled', 'available')
      AND j.run_at <= coalesce(%(now)s::timestamptz, now())
      AND NOT j.isolated
      AND j.limit_key IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.x_queues p WHERE p.name = %(queue)s AND p.paused
      )
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE {schema}.x_jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = coalesce(%(now)s::timestamptz, now()),
        lease_token = %(token)s || '.' || j.id,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease_for)s::interval,
        worker_id = %(worker_id)s,
        started = true  -- claimed in a worker's cycle: its handlers are free now
    FROM due
    WHERE j.id = due.id AND (SELECT off FROM relax) IS NOT NULL
    RETURNING j.id, j.name, j.queue, j.input::text, j.tenant_id, j.idempotency_key,
              j.priority, j.state, j.attempt, j.max_attempts, j.run_at, j.created_at,
              j.attempted_at, j.finished_at, j.lease_token, j.lease_expires_at, j.worker_id,
              j.errors::text, j.cancel_reason, j.trace_context, j.result::text
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id

-- name: job_cycle_queue
-- A worker's usual turn as one statement, a transaction alone: job_complete's fenced write of
-- finished jobs (unlimited ones: a worker that claims no limited jobs holds none), then
-- job_claim_queue's claim for one queue ({limit} written into the text, as there). The two
-- touch different rows (running ones, waiting ones), so one snapshot serves both. It returns
-- the claimed rows, each with the completed ids beside them, or one row of NULLs with those
-- ids when nothing was claimed. Its parts repeat those statements word for word (a unit test
-- compares them).
WITH done AS (
    UPDATE {schema}.x_jobs j
    SET state = 'completed',
        finished_at = coalesce(%(now)s::timestamptz, now()),
        result = (%(results)s::text[])[array_position(%(ids)s::text[], j.id)]::json,
        lease_token = NULL,
        lease_expires_at = NULL
    -- A lease token is set exactly while its job runs (x_jobs_lease_check): no state test,
    -- which would let the planner walk every running job's lease entry, rows that other
    -- workers are writing, instead of probing the primary key for these ids.
    WHERE j.id = ANY(%(ids)s::text[])
      AND j.lease_token = ANY(%(tokens)s::text[])
    RETURNING j.id, j.awaited
),
ended AS (
    SELECT array_agg(id) AS ids,
           (SELECT pg_notify(%(finished)s,
                             CASE WHEN sum(length(id) + 1) < 7000 THEN string_agg(id, ',')
                                  ELSE '' END)
            FROM done WHERE awaited HAVING count(*) > 0) AS notified
    FROM done
),
due AS (
    SELECT j.id
    FROM {schema}.x_jobs j
    WHERE j.queue = %(queue)s
      AND j.state IN ('scheduled', 'available')
      AND j.run_at <= coalesce(%(now)s::timestamptz, now())
      AND NOT j.isolated
      AND j.limit_key IS NULL
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.x_queues p WHERE p.name = %(queue)s AND p.paused
      )
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT {limit}
    FOR UPDATE SKIP LOCKED
),
claimed AS (
    UPDATE {schema}.x_jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = coalesce(%(now)s::timestamptz, now()),
        lease_token = %(token)s || '.' || j.id,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease_for)s::interval,
        worker_id = %(worker_id)s,
        started = true  -- claimed in a worker's cycle: its handlers are free now
    FROM due
    WHERE j.id = due.id
    RETURNING j.id, j.name, j.queue, j.input::text, j.tenant_id, j.idempotency_key,
              j.priority, j.state, j.attempt, j.max_attempts, j.run_at, j.created_at,
              j.attempted_at, j.finished_at, j.lease_token, j.lease_expires_at, j.worker_id,
              j.errors::text, j.cancel_reason, j.trace_context, j.result::text
)
SELECT c.*, e.ids, e.notified IS NULL
FROM ended e LEFT JOIN claimed c ON true
ORDER BY c.priority DESC, c.run_at, c.id

-- name: job_peek_isolated
SELECT EXISTS (
    SELECT 1 FROM {schema}.x_jobs j
    WHERE j.isolated
      AND j.state IN ('scheduled', 'available')
      AND j.run_at <= coalesce(%(now)s::timestamptz, now())
      AND j.queue = ANY(%(queues)s::text[])
      AND NOT EXISTS (SELECT 1 FROM {schema}.x_queues p WHERE p.name = j.queue AND p.paused)
)

-- name: lease_extend
-- Leases arrive as two arrays, ids and tokens, matched as sets: a token (a fresh random claim
-- token, a dot, the row's id) is issued to one claim of one row, so a row whose id and current
-- token are both listed holds exactly one of the given leases. Pairing them with a join
-- instead would leave the plan to row estimates; this is a primary-key probe per id.
UPDATE {schema}.x_jobs j
SET lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease_for)s::interval
WHERE j.id = ANY(%(ids)s::text[])
  AND j.lease_token = ANY(%(tokens)s::text[])
  AND j.state = 'running'
RETURNING j.id

-- name: job_release_claim
-- The jobs of one claim whose reply its worker never got (the connection broke after the claim
-- committed), found by the claim's token: each job's lease token is the token, a dot, its id.
-- The worker never saw them, so never ran them: back at once, attempt refunded.
WITH released AS (
    UPDATE {schema}.x_jobs j
    SET state = 'available',
        run_at = coalesce(%(now)s::timestamptz, now()),
        attempt = greatest(j.attempt - 1, 0),
        lease_token = NULL,
        lease_expires_at = NULL,
        started = false
    WHERE j.state = 'running' AND j.lease_expires_at IS NOT NULL
      AND starts_with(j.lease_token, %(token)s || '.')
    RETURNING j.id, j.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM released) q
)
SELECT r.id, (SELECT count(*) FROM woken) FROM released r

-- name: job_complete
-- %(results)s is NULL when no job of the batch has a result (the usual case), else a text[]
-- beside %(ids)s: each job's result (JSON text, NULL for None) at its id's position. The
-- completed ids that a reader awaits (migration 7) are sent to %(finished)s (all of them while
-- they fit a NOTIFY payload; '' means "any job may have finished"); none is sent when no
-- reader waits, since every NOTIFY takes a database-wide lock at commit. A limited job
-- frees a slot: its queue is sent to %(channel)s, to wake the workers waiting on a full limit
-- (the server sends one per queue and transaction); unlimited jobs send nothing there.
WITH done AS (
    UPDATE {schema}.x_jobs j
    SET state = 'completed',
        finished_at = coalesce(%(now)s::timestamptz, now()),
        result = (%(results)s::text[])[array_position(%(ids)s::text[], j.id)]::json,
        lease_token = NULL,
        lease_expires_at = NULL
    -- A lease token is set exactly while its job runs (x_jobs_lease_check): no state test,
    -- which would let the planner walk every running job's lease entry, rows that other
    -- workers are writing, instead of probing the primary key for these ids.
    WHERE j.id = ANY(%(ids)s::text[])
      AND j.lease_token = ANY(%(tokens)s::text[])
    RETURNING j.id, j.queue, j.limit_key, j.awaited
)
SELECT d.id,
       (SELECT pg_notify(%(finished)s,
                         CASE WHEN sum(length(id) + 1) < 7000 THEN string_agg(id, ',') ELSE '' END)
        FROM done WHERE awaited HAVING count(*) > 0),
       CASE WHEN d.limit_key IS NOT NULL THEN pg_notify(%(channel)s, d.queue) END
FROM done d

-- name: job_fail
-- f.retry_us: the microseconds after now (the database's clock unless %(now)s pins it) that the
-- retry is due; NULL parks the job as dead. The ids of awaited jobs that end dead go to
-- %(finished)s, as in job_complete.
WITH failed AS (
UPDATE {schema}.x_jobs j
SET state = CASE
        WHEN f.retry_us IS NULL THEN 'dead'
        WHEN f.retry_us > 0 THEN 'scheduled'
        ELSE 'available'
    END,
    run_at = coalesce(coalesce(%(now)s::timestamptz, now())
                      + f.retry_us * interval '1 microsecond', j.run_at),
    finished_at = CASE WHEN f.retry_us IS NULL THEN coalesce(%(now)s::timestamptz, now()) END,
    errors = j.errors || jsonb_build_array(f.error),
    -- A rescue of a job that ran beside others gives its attempt back (f.refund).
    attempt = CASE WHEN f.refund THEN greatest(j.attempt - 1, 0) ELSE j.attempt END,
    lease_token = NULL,
    lease_expires_at = NULL,
    isolated = coalesce(f.isolate, false)
FROM json_to_recordset(%(failures)s::json)
       AS f(id text, token text, error jsonb, retry_us bigint, isolate boolean,
            refund boolean)
WHERE j.id = ANY(%(ids)s::text[])
  AND j.id = f.id AND j.lease_token = f.token AND j.state = 'running'
RETURNING j.id, j.state, j.queue, j.limit_key, j.awaited
)
SELECT d.id,
       (SELECT pg_notify(%(finished)s,
                         CASE WHEN sum(length(id) + 1) < 7000 THEN string_agg(id, ',') ELSE '' END)
        FROM failed WHERE state = 'dead' AND awaited HAVING count(*) > 0),
       CASE WHEN d.limit_key IS NOT NULL THEN pg_notify(%(channel)s, d.queue) END
FROM failed d

-- name: job_snooze
-- Due %(delay_us)s microseconds after now (the database's clock unless %(now)s pins it); NULL
-- keeps the job's due time (a release that keeps its place).
WITH snoozed AS (
    UPDATE {schema}.x_jobs j
    SET state = CASE
            WHEN coalesce(coalesce(%(now)s::timestamptz, now())
                          + %(delay_us)s::bigint * interval '1 microsecond', j.run_at)
                 > coalesce(%(now)s::timestamptz, now())
            THEN 'scheduled' ELSE 'available'
        END,
        run_at = coalesce(coalesce(%(now)s::timestamptz, now())
                          + %(delay_us)s::bigint * interval '1 microsecond', j.run_at),
        attempt = greatest(j.attempt - 1, 0),
        lease_token = NULL,
        lease_expires_at = NULL
    WHERE j.id = %(id)s AND j.lease_token = %(token)s AND j.state = 'running'
    RETURNING j.queue, j.state
),
woken AS (
    SELECT pg_notify(%(channel)s, queue) FROM snoozed WHERE state = 'available'
)
SELECT (SELECT count(*) FROM snoozed), (SELECT count(*) FROM woken)

-- name: job_cancel
WITH cancelled AS (
UPDATE {schema}.x_jobs j
SET state = 'cancelled',
    finished_at = coalesce(%(now)s::timestamptz, now()),
    cancel_reason = %(reason)s,
    lease_token = NULL,
    lease_expires_at = NULL
WHERE j.id = %(id)s
  AND j.state IN ('scheduled', 'available', 'running')
  AND (%(token)s::text IS NULL OR (j.state = 'running' AND j.lease_token = %(token)s::text))
  AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
RETURNING j.id, j.awaited
)
SELECT id, CASE WHEN awaited THEN pg_notify(%(finished)s, id) END FROM cancelled

-- name: job_await
-- A reader is about to wait for this job's end (job_wait with LISTEN): from now on its
-- completion, dead end or cancel notifies the finished channel (migration 7). Nothing for a job that
-- has ended: the reader reads it next. The row is locked until this commits, and a claim
-- passes over locked rows (SKIP LOCKED): a worker woken by the job's insert may have claimed
-- just then and found nothing, and would sleep until its next poll. A due job's queue is
-- notified again at this commit, so that it claims once more.
WITH marked AS (
    UPDATE {schema}.x_jobs j
    SET awaited = true
    WHERE j.id = %(id)s
      AND NOT j.awaited
      AND j.state IN ('scheduled', 'available', 'running')
      AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
    RETURNING j.id, j.queue, j.state, j.run_at
)
SELECT id,
       CASE WHEN state <> 'running' AND run_at <= now() THEN pg_notify(%(channel)s, queue) END
FROM marked

-- name: job_list_expired
-- %(isolated)s NULL lists every one, true those that ran alone, false those beside others.
SELECT id, name, queue, input::text, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors::text, cancel_reason, trace_context, result::text
FROM {schema}.x_jobs
WHERE state = 'running' AND lease_expires_at < coalesce(%(now)s::timestamptz, now())
  AND started AND (%(isolated)s::boolean IS NULL OR isolated = %(isolated)s::boolean)
ORDER BY lease_expires_at, id
LIMIT %(limit)s

-- name: job_list_running
-- Every running job, on the lease index (which holds running rows only).
SELECT id, name, queue, input::text, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors::text, cancel_reason, trace_context, result::text
FROM {schema}.x_jobs
WHERE state = 'running'
ORDER BY lease_expires_at, id
LIMIT %(limit)s

-- name: job_get
SELECT id, name, queue, input::text, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors::text, cancel_reason, trace_context, result::text
FROM {schema}.x_jobs
WHERE id = %(id)s AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)

-- name: job_list
-- Optional filters are "param IS NULL OR ...": run unprepared, each execution is planned with
-- its values, so the unused filters fold away and the primary key serves "newest id first".
SELECT id, name, queue, input::text, tenant_id, idempotency_key, priority, state, attempt,
       max_attempts, run_at, created_at, attempted_at, finished_at, lease_token,
       lease_expires_at, worker_id, errors::text, cancel_reason, trace_context, result::text
FROM {schema}.x_jobs
WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
  AND (%(ids)s::text[] IS NULL OR id = ANY(%(ids)s::text[]))
  AND (%(before_id)s::text IS NULL OR id < %(before_id)s::text)
  AND (%(min_id)s::text IS NULL OR id >= %(min_id)s::text)
ORDER BY id DESC
LIMIT %(limit)s

-- name: job_id_below
-- The id %(offset)s places below %(before_id)s, newest first (unprepared, like job_list).
SELECT id FROM {schema}.x_jobs
WHERE (%(before_id)s::text IS NULL OR id < %(before_id)s::text)
ORDER BY id DESC
LIMIT 1 OFFSET %(offset)s

-- name: job_count
SELECT queue, state, count(*)
FROM {schema}.x_jobs
WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
  AND (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
  AND (%(ids)s::text[] IS NULL OR id = ANY(%(ids)s::text[]))
  AND (%(min_id)s::text IS NULL OR id >= %(min_id)s::text)
GROUP BY queue, state

-- name: job_retry
WITH retried AS (
    UPDATE {schema}.x_jobs j
    SET state = 'available',
        run_at = coalesce(%(now)s::timestamptz, now()),
        finished_at = NULL,
        cancel_reason = NULL,
        max_attempts = greatest(j.max_attempts, j.attempt + 1)
    WHERE j.id = ANY(%(ids)s::text[])
      AND j.state IN ('dead', 'cancelled')
      AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
    RETURNING j.id, j.queue
),
woken AS (
    SELECT pg_notify(%(channel)s, q.queue) FROM (SELECT DISTINCT queue FROM retried) q
)
SELECT r.id, (SELECT count(*) FROM woken) FROM retried r

-- name: job_discard
DELETE FROM {schema}.x_jobs j
WHERE j.id = ANY(%(ids)s::text[])
  AND j.state IN ('dead', 'cancelled')
  AND (%(tenant_id)s::text IS NULL OR j.tenant_id = %(tenant_id)s::text)
RETURNING j.id

-- name: job_prune
-- SKIP LOCKED: two pruners split the work instead of queueing behind each other.
WITH doomed AS (
    SELECT id
    FROM {schema}.x_jobs
    WHERE finished_at < %(before)s::timestamptz AND state = ANY(%(states)s::text[])
    ORDER BY finished_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {schema}.x_jobs j USING doomed WHERE j.id = doomed.id

-- name: queue_set_paused
WITH saved AS (
    INSERT INTO {schema}.x_queues AS q (name, paused, updated_at)
    VALUES (%(name)s, %(paused)s, now())
    ON CONFLICT (name) DO UPDATE SET paused = excluded.paused, updated_at = excluded.updated_at
    RETURNING q.name, q.paused
),
woken AS (
    SELECT pg_notify(%(channel)s, name) FROM saved WHERE NOT paused
)
SELECT (SELECT count(*) FROM saved), (SELECT count(*) FROM woken)

-- name: queue_list
-- The counts are the sums of the deltas the triggers of migration 5 append (folded by
-- job_counts_fold); the last column says how many delta rows were summed.
SELECT coalesce(c.queue, p.name), coalesce(p.paused, false), c.state, coalesce(c.n, 0),
       coalesce(c.rows, 0)
FROM (
    SELECT queue, state, sum(n)::bigint AS n, count(*) AS rows FROM {schema}.x_job_counts
    GROUP BY queue, state HAVING sum(n) <> 0
) c
FULL JOIN {schema}.x_queues p ON p.name = c.queue

-- name: job_finished_counts
-- A range of the finished index; k is the bucket index from %(since)s (bucket in seconds).
SELECT queue, state,
       floor(extract(epoch FROM finished_at - %(since)s::timestamptz) / %(bucket)s)::bigint AS k,
       count(*)
FROM {schema}.x_jobs
WHERE finished_at IS NOT NULL AND finished_at >= %(since)s::timestamptz
  AND state IN ('completed', 'dead', 'cancelled')
  AND (%(tenant_id)s::text IS NULL OR tenant_id = %(tenant_id)s::text)
GROUP BY 1, 2, 3

-- name: job_count_kept
-- job_count for a filter of states and queue only, from the kept counts.
SELECT queue, state, sum(n)::bigint FROM {schema}.x_job_counts
WHERE (%(states)s::text[] IS NULL OR state = ANY(%(states)s::text[]))
  AND (%(queue)s::text IS NULL OR queue = %(queue)s::text)
GROUP BY queue, state HAVING sum(n) <> 0

-- name: job_counts_fold
-- One row per (queue, state): the deltas deleted are summed back in the same statement, so
-- a delta appended meanwhile (not seen by the DELETE) is kept as it is.
WITH gone AS (DELETE FROM {schema}.x_job_counts RETURNING queue, state, n)
INSERT INTO {schema}.x_job_counts (queue, state, n)
SELECT queue, state, sum(n) FROM gone GROUP BY queue, state HAVING sum(n) <> 0

-- name: queue_oldest_ready
-- Per queue with a waiting job, the run_at of the oldest one due now (NULL: none is due
-- yet), on the claim index x_jobs_claim_idx (queue, priority DESC, run_at, id), no index of
-- its own (one that led with run_at would tempt the planner away from it for claims): a
-- loose index scan of the (queue, priority) groups, each step a seek (the same queue's next
-- priority, else the next queue), then the first row of each group, its smallest run_at.
WITH RECURSIVE g AS (
    (SELECT queue, priority FROM {schema}.x_jobs
     WHERE state IN ('scheduled', 'available') AND limit_key IS NULL
     ORDER BY queue, priority DESC LIMIT 1)
    UNION ALL
    SELECT n.queue, n.priority
    FROM g, LATERAL (
        SELECT * FROM (
            (SELECT j.queue, j.priority FROM {schema}.x_jobs j
             WHERE j.state IN ('scheduled', 'available') AND j.limit_key IS NULL
               AND j.queue = g.queue AND j.priority < g.priority
             ORDER BY j.priority DESC LIMIT 1)
            UNION ALL
            (SELECT j.queue, j.priority FROM {schema}.x_jobs j
             WHERE j.state IN ('scheduled', 'available') AND j.limit_key IS NULL
               AND j.queue > g.queue
             ORDER BY j.queue, j.priority DESC LIMIT 1)
        ) step
        LIMIT 1
    ) n
)
SELECT g.queue,
       min(f.run_at) FILTER (WHERE f.run_at <= coalesce(%(now)s::timestamptz, now()))
FROM g, LATERAL (
    SELECT j.run_at FROM {schema}.x_jobs j
    WHERE j.state IN ('scheduled', 'available') AND j.limit_key IS NULL
      AND j.queue = g.queue AND j.priority = g.priority
    ORDER BY j.priority DESC, j.run_at LIMIT 1
) f
GROUP BY g.queue
UNION ALL
-- Limited jobs (not in the claim index, which holds limit_key IS NULL only, migration 6): a
-- walk of x_jobs_claim_limited's waiting rows, not of the table.
SELECT queue, min(run_at) FROM {schema}.x_jobs
WHERE state IN ('scheduled', 'available') AND limit_key IS NOT NULL
  AND run_at <= coalesce(%(now)s::timestamptz, now())
GROUP BY queue

-- name: schedule_register
INSERT INTO {schema}.x_schedules (task, first_seen_at)
SELECT t.task, coalesce(%(now)s::timestamptz, now())
FROM unnest(%(tasks)s::text[]) AS t(task)
ON CONFLICT (task) DO NOTHING

-- name: schedule_read
SELECT task, first_seen_at, last_fired_at
FROM {schema}.x_schedules
WHERE task = ANY(%(tasks)s::text[])

-- name: schedule_advance
-- The compare-and-set: a concurrent scheduler waits on the row lock, then sees the committed
-- last_fired_at, fails the WHERE and gets no row back.
INSERT INTO {schema}.x_schedules AS s (task, first_seen_at, last_fired_at)
VALUES (%(task)s, coalesce(%(now)s::timestamptz, now()), %(occurrence)s::timestamptz)
ON CONFLICT (task) DO UPDATE SET last_fired_at = excluded.last_fired_at
    WHERE s.last_fired_at IS NULL OR s.last_fired_at < excluded.last_fired_at
RETURNING s.task

-- name: schedule_rewind
-- The repair of a last-fired time in the future (the clock stepped back): compare-and-set.
UPDATE {schema}.x_schedules SET last_fired_at = %(to)s::timestamptz
WHERE task = %(task)s AND last_fired_at = %(was)s::timestamptz
RETURNING task

-- name: database_now
-- The clock of every decision on PostgreSQL (the scheduler's time, leases, run-at times).
SELECT now()

-- name: leader_elect
INSERT INTO {schema}.x_leaders AS l (name, holder, elected_at, expires_at)
VALUES (%(name)s, %(holder)s, coalesce(%(now)s::timestamptz, now()),
        coalesce(%(now)s::timestamptz, now()) + %(ttl)s::interval)
ON CONFLICT (name) DO UPDATE
    SET holder = excluded.holder,
        expires_at = excluded.expires_at,
        elected_at = CASE WHEN l.holder = excluded.holder THEN l.elected_at
                          ELSE excluded.elected_at END
    WHERE l.holder = excluded.holder OR l.expires_at <= excluded.elected_at
RETURNING l.holder

-- name: leader_resign
DELETE FROM {schema}.x_leaders WHERE name = %(name)s AND holder = %(holder)s

-- name: job_newest
-- The polling waiter's look (no LISTEN): the newest job id, one backward probe of the primary
-- key. Ids are UUIDv7 text, so a new job's id sorts after the ones before it.
SELECT max(id) FROM {schema}.x_jobs

-- name: worker_beat
INSERT INTO {schema}.x_workers AS w
    (id, host, pid, queues, concurrency, started_at, heartbeat_at, version)
VALUES (%(id)s, %(host)s, %(pid)s, %(queues)s::text[], %(concurrency)s, %(started_at)s,
        coalesce(%(now)s::timestamptz, now()), %(version)s)
ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at, queues = excluded.queues,
    concurrency = excluded.concurrency, version = excluded.version

-- name: worker_remove
DELETE FROM {schema}.x_workers WHERE id = %(id)s

-- name: worker_prune
DELETE FROM {schema}.x_workers
WHERE heartbeat_at < coalesce(%(now)s::timestamptz, now()) - %(stale)s::interval
RETURNING id

-- name: worker_list
SELECT id, host, pid, queues, concurrency, started_at, heartbeat_at, version
FROM {schema}.x_workers ORDER BY id

-- name: job_flow
-- Where a job's partition stands (Driver.job_flow): the counts a limited claim makes.
SELECT j.limit_key, j.limit_max,
       (SELECT count(*) FROM {schema}.x_jobs r
        WHERE r.limit_key = j.limit_key AND r.state = 'running'
          AND r.lease_expires_at > coalesce(%(now)s::timestamptz, now())),
       j.rate_max, j.rate_period,
       (SELECT count(*) FROM {schema}.x_jobs r
        WHERE j.rate_max > 0 AND r.limit_key = j.limit_key
          AND r.attempted_at IS NOT NULL AND r.rate_max > 0
          AND r.attempted_at > coalesce(%(now)s::timestamptz, now())
                               - j.rate_period * interval '1 microsecond'),
       (SELECT min(r.attempted_at) FROM {schema}.x_jobs r
        WHERE j.rate_max > 0 AND r.limit_key = j.limit_key
          AND r.attempted_at IS NOT NULL AND r.rate_max > 0
          AND r.attempted_at > coalesce(%(now)s::timestamptz, now())
                               - j.rate_period * interval '1 microsecond')
FROM {schema}.x_jobs j
WHERE j.id = %(id)s AND j.limit_key IS NOT NULL

-- name: job_claim_limited_setup
-- Before a claim with limits, for the rest of its transaction. Its two statements are planned
-- with rough row counts (lateral LIMITs): planning them afresh each time cost more than running
-- them (milliseconds), and their estimated cost made the server JIT-compile them (over a
-- second for statements that run in a millisecond). Their generic plans are index walks
-- whatever the parameters.
SELECT set_config('plan_cache_mode', 'force_generic_plan', true),
       set_config('jit', 'off', true)

-- name: job_limit_lock
-- Step 1 of a claim with limits (ultimat3/jobs/limits.py). Per queue, up to %(keys)s keys with
-- due jobs, from the one after %(after)s (a skip scan: one seek of x_jobs_claim_limited_idx per
-- key), then from the start up to %(after)s. Of those whose slots look free in this
-- statement's snapshot, up to %(limit)s are locked without waiting (pg_try_advisory_xact_lock,
-- held to the end of the transaction; a key another claim holds is skipped) and recorded in a
-- transaction-local setting for job_claim_limited. That statement runs next in the same
-- transaction, so with a snapshot taken after the locks: its count of running jobs is exact.
-- Also returns where the next claim goes on (the cursor), and how long after this statement's
-- now a full rate window reopens (a wait, on the database's clock: never a time the worker
-- would compare with its own).
WITH RECURSIVE fwd(queue, k, n) AS (
    SELECT q.name,
           (SELECT j.limit_key FROM {schema}.x_jobs j
            WHERE j.queue = q.name AND j.state IN ('scheduled', 'available')
              AND j.limit_key IS NOT NULL AND j.limit_key > %(after)s
              AND j.run_at <= coalesce(%(now)s::timestamptz, now())
              AND j.isolated = %(isolated)s
            ORDER BY j.limit_key LIMIT 1),
           1
    FROM unnest(%(queues)s::text[]) AS q(name)
    UNION ALL
    SELECT f.queue,
           (SELECT j.limit_key FROM {schema}.x_jobs j
            WHERE j.queue = f.queue AND j.state IN ('scheduled', 'available')
              AND j.limit_key IS NOT NULL AND j.limit_key > f.k
              AND j.run_at <= coalesce(%(now)s::timestamptz, now())
              AND j.isolated = %(isolated)s
            ORDER BY j.limit_key LIMIT 1),
           f.n + 1
    FROM fwd f
    WHERE f.k IS NOT NULL AND f.n < %(keys)s
),
back(queue, k, n) AS (
    SELECT q.name,
           (SELECT j.limit_key FROM {schema}.x_jobs j
            WHERE j.queue = q.name AND j.state IN ('scheduled', 'available')
              AND j.limit_key IS NOT NULL
              AND j.run_at <= coalesce(%(now)s::timestamptz, now())
              AND j.isolated = %(isolated)s
            ORDER BY j.limit_key LIMIT 1),
           1
    FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE %(after)s <> ''
    UNION ALL
    SELECT b.queue,
           (SELECT j.limit_key FROM {schema}.x_jobs j
            WHERE j.queue = b.queue AND j.state IN ('scheduled', 'available')
              AND j.limit_key IS NOT NULL AND j.limit_key > b.k
              AND j.run_at <= coalesce(%(now)s::timestamptz, now())
              AND j.isolated = %(isolated)s
            ORDER BY j.limit_key LIMIT 1),
           b.n + 1
    FROM back b
    WHERE b.k IS NOT NULL AND b.k <= %(after)s
      AND b.n < %(keys)s - (SELECT count(*) FROM fwd WHERE k IS NOT NULL)  -- keys in all
),
looked AS (
    SELECT k, 0 AS pass, n FROM fwd WHERE k IS NOT NULL
    UNION ALL
    SELECT k, 1, n FROM back WHERE k IS NOT NULL AND k <= %(after)s
),
flows AS (
    -- Each key once, in pass order, with the limits of one of its waiting jobs, how many of
    -- its jobs run, and (under a rate limit) its starts within the window and the oldest one.
    SELECT h.k, h.pos, f.limit_max, f.rate_max, f.rate_period, u.running, u.starts, u.oldest,
           u.due
    FROM (SELECT k, min(pass * %(keys)s + n) AS pos FROM looked GROUP BY k) h
    CROSS JOIN LATERAL (
        -- Per queue, so that (queue, limit_key) is an index prefix of x_jobs_claim_limited_idx.
        SELECT j.limit_max, j.rate_max, j.rate_period
        FROM unnest(%(queues)s::text[]) AS fq(name)
        CROSS JOIN LATERAL (
            SELECT j.limit_max, j.rate_max, j.rate_period FROM {schema}.x_jobs j
            WHERE j.queue = fq.name AND j.limit_key = h.k
              AND j.state IN ('scheduled', 'available')
            ORDER BY j.priority DESC, j.run_at, j.id  -- the head job, by index
            LIMIT 1
        ) j
        LIMIT 1
    ) f
    CROSS JOIN LATERAL (
        SELECT (SELECT count(*) FROM {schema}.x_jobs r
                WHERE r.limit_key = h.k AND r.state = 'running'
                  AND r.lease_expires_at > coalesce(%(now)s::timestamptz, now())) AS running,
               (SELECT count(*) FROM {schema}.x_jobs r
                WHERE f.rate_max > 0 AND r.limit_key = h.k
                  AND r.attempted_at IS NOT NULL AND r.rate_max > 0
                  AND r.attempted_at > coalesce(%(now)s::timestamptz, now())
                                       - f.rate_period * interval '1 microsecond') AS starts,
               (SELECT min(r.attempted_at) FROM {schema}.x_jobs r
                WHERE f.rate_max > 0 AND r.limit_key = h.k
                  AND r.attempted_at IS NOT NULL AND r.rate_max > 0
                  AND r.attempted_at > coalesce(%(now)s::timestamptz, now())
                                       - f.rate_period * interval '1 microsecond') AS oldest,
               (SELECT count(*) FROM unnest(%(queues)s::text[]) AS dq(name)
                CROSS JOIN LATERAL (
                    SELECT 1 FROM {schema}.x_jobs j
                    WHERE j.queue = dq.name AND j.limit_key = h.k
                      AND j.state IN ('scheduled', 'available')
                      AND j.run_at <= coalesce(%(now)s::timestamptz, now())
                      AND j.isolated = %(isolated)s
                    LIMIT %(limit)s
                ) d) AS due
    ) u
),
open AS (
    -- How many each key could give: its free slots (by running jobs, by starts in a rate
    -- window) and its due jobs. A key that looks full now is left alone; one that looks free
    -- is counted again, exactly, by the claim once its lock is held.
    SELECT k, pos, limit_max, rate_max, rate_period,
           least(limit_max - running,
                 CASE WHEN rate_max > 0 THEN rate_max - starts ELSE limit_max END,
                 due) AS avail
    FROM flows
),
walk(k, pos, need, n, locked, limit_max, rate_max, rate_period) AS (
    -- The open keys in order, one lock tried at a time (without waiting: a key another claim
    -- holds is skipped), until the keys got can fill the claim; n: how many the claim takes
    -- from the key at most (what it gives, and what the claim still needs).
    SELECT NULL::text COLLATE "C", -1::bigint, %(limit)s::bigint, 0::bigint, false,
           0, 0, 0::bigint
    UNION ALL
    SELECT o.k, o.pos,
           w.need - CASE WHEN l.locked THEN least(o.avail, w.need) ELSE 0 END,
           least(o.avail, w.need), l.locked, o.limit_max, o.rate_max, o.rate_period
    FROM walk w
    CROSS JOIN LATERAL (
        SELECT k, pos, avail, limit_max, rate_max, rate_period FROM open
        WHERE pos > w.pos AND avail > 0 ORDER BY pos LIMIT 1
    ) o
    CROSS JOIN LATERAL (
        SELECT pg_try_advisory_xact_lock(%(lock_class)s, hashtext(o.k)) AS locked
    ) l
    WHERE w.need > 0
),
got AS (
    SELECT k, pos, n, limit_max, rate_max, rate_period FROM walk WHERE locked
)
SELECT set_config('ultimat3_jobs.limit_keys',
                  -- [[key, at most, limit_max, rate_max, rate_period], ...] in turn order
                  coalesce((SELECT json_agg(json_build_array(k, n, limit_max, rate_max,
                                                             rate_period) ORDER BY pos)
                            FROM got)::text, '[]'),
                  true),
       -- Round-robin: the next claim starts after the last key got; with none, past the
       -- full keys looked at.
       coalesce((SELECT k FROM got ORDER BY pos DESC LIMIT 1),
                (SELECT max(k) FROM back WHERE n = %(keys)s AND k <= %(after)s),
                (SELECT max(k) FROM fwd WHERE n = %(keys)s)),
       -- How long until the first full rate window reopens: its oldest start leaves it.
       (SELECT min(oldest + rate_period * interval '1 microsecond') FROM flows
        WHERE rate_max > 0 AND starts >= rate_max AND running < limit_max)
       - coalesce(%(now)s::timestamptz, now())

-- name: job_claim_limited
-- Steps 2 and 3: the unlimited due jobs (as job_claim) and, for each key job_limit_lock got,
-- its first `free` due jobs (free slots by running jobs, and by starts within a rate window);
-- then the best %(limit)s of both, keys taking turns within a priority. The
-- limited rows need no row lock (every claim of them holds their key's lock); the UPDATE checks
-- their state again in case a cancel got there first.
WITH free AS (
    -- The unlimited jobs take turns as one key, first (turn -1).
    SELECT c.id, c.priority, c.run_at,
           row_number() OVER (PARTITION BY q.name ORDER BY c.priority DESC, c.run_at, c.id) AS rank,
           -1::bigint AS turn
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {schema}.x_jobs j
        WHERE j.queue = q.name
          AND j.state IN ('scheduled', 'available')
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
          AND j.isolated = %(isolated)s
          AND j.limit_key IS NULL
          AND j.name <> ALL(%(skip)s::text[])
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) c
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.x_queues p WHERE p.name = q.name AND p.paused
    )
),
held AS (
    SELECT e.value ->> 0 AS k, (e.value ->> 1)::bigint AS n, (e.value ->> 2)::int AS limit_max,
           (e.value ->> 3)::int AS rate_max, (e.value ->> 4)::bigint AS rate_period, e.turn
    FROM json_array_elements(
        coalesce(nullif(current_setting('ultimat3_jobs.limit_keys', true), ''), '[]')::json
    ) WITH ORDINALITY AS e(value, turn)
),
lim_keys AS (
    SELECT h.k, h.turn, least(s.free, h.n) AS free
    FROM held h
    CROSS JOIN LATERAL (
        -- The key's free slots (its head job's limits come from job_limit_lock), counted again
        -- under this statement's snapshot: by its running jobs, and its starts in the window.
        SELECT least(
            h.limit_max - (
                SELECT count(*) FROM {schema}.x_jobs r
                WHERE r.limit_key = h.k AND r.state = 'running'
                  AND r.lease_expires_at > coalesce(%(now)s::timestamptz, now())
            ),
            CASE WHEN h.rate_max = 0 THEN h.limit_max ELSE h.rate_max - (
                SELECT count(*) FROM {schema}.x_jobs r
                WHERE r.limit_key = h.k AND r.attempted_at IS NOT NULL AND r.rate_max > 0
                  AND r.attempted_at > coalesce(%(now)s::timestamptz, now())
                                       - h.rate_period * interval '1 microsecond'
            ) END
        ) AS free
    ) s
),
lim_rows AS (
    -- Each key's first `free` due jobs, per queue (an index walk in claim order each)...
    SELECT k.k, k.turn, k.free, c.id, c.priority, c.run_at
    FROM lim_keys k
    CROSS JOIN unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM {schema}.x_jobs j
        WHERE j.queue = q.name
          AND j.limit_key = k.k
          AND j.state IN ('scheduled', 'available')
          AND j.run_at <= coalesce(%(now)s::timestamptz, now())
          AND j.isolated = %(isolated)s
          AND j.name <> ALL(%(skip)s::text[])
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT least(%(limit)s, greatest(k.free, 0))
    ) c
    WHERE NOT EXISTS (
        SELECT 1 FROM {schema}.x_queues p WHERE p.name = q.name AND p.paused
    )
),
lim AS (
    -- ... and across its queues, its first `free` of them.
    SELECT r.id, r.priority, r.run_at, r.rank, r.turn
    FROM (
        SELECT lr.*, row_number() OVER (
            PARTITION BY lr.k ORDER BY lr.priority DESC, lr.run_at, lr.id
        ) AS rank
        FROM lim_rows lr
    ) r
    WHERE r.rank <= r.free
),
due AS (
    -- Within a priority, keys take turns (round-robin): every key's first job, in the order
    -- of the keys after the cursor, then every key's second, and so on.
    SELECT a.id FROM (SELECT * FROM free UNION ALL SELECT * FROM lim) a
    ORDER BY a.priority DESC, a.rank, a.turn, a.run_at, a.id
    LIMIT %(limit)s
),
claimed AS (
    UPDATE {schema}.x_jobs j
    SET state = 'running',
        attempt = j.attempt + 1,
        attempted_at = coalesce(%(now)s::timestamptz, now()),
        lease_token = %(token)s || '.' || j.id,
        lease_expires_at = coalesce(%(now)s::timestamptz, now()) + %(lease_for)s::interval,
        worker_id = %(worker_id)s,
        started = true
    WHERE j.id = ANY(ARRAY(SELECT id FROM due))
      AND j.state IN ('scheduled', 'available')
    RETURNING j.id, j.name, j.queue, j.input::text, j.tenant_id, j.idempotency_key,
              j.priority, j.state, j.attempt, j.max_attempts, j.run_at, j.created_at,
              j.attempted_at, j.finished_at, j.lease_token, j.lease_expires_at, j.worker_id,
              j.errors::text, j.cancel_reason, j.trace_context, j.result::text
)
SELECT * FROM claimed ORDER BY priority DESC, run_at, id

"""What ``with app.using(conn): handle.enqueue(x)`` adds to a business transaction, beside
what a bare INSERT of the same job row adds, on SQLite and PostgreSQL.

    python bench/using_cost.py                     # both databases, 2,000 rounds each
    python bench/using_cost.py --driver sqlite --rounds 500

Each round runs five fresh business transactions on the caller's own connection, in turns
(``run.kinds_medians``): the business INSERT alone; it and a bare INSERT into the job table;
it inside ``with app.using(conn):`` with one ``handle.enqueue``; it inside ``using()`` with
no enqueue (what joining alone costs); and it with the statements the joined enqueue sends
(its savepoint, and on SQLite the clock frame's read and the kept count), run bare with the
row's values made before the timings: the floor of the SQL, so the rest of the enqueue's
cost is the library's Python. The added costs are medians minus the first kind's median.
Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from run import BARE_JOB_INSERT, kinds_medians  # noqa: E402

from ultimat3.jobs import App, job  # noqa: E402
from ultimat3.jobs.clock import utcnow, wall_ns  # noqa: E402
from ultimat3.jobs.dialects.postgres import RELEASE_SQL, SAVEPOINT_SQL  # noqa: E402
from ultimat3.jobs.drivers.sqlite.insert import job_row  # noqa: E402
from ultimat3.jobs.ids import uuid7  # noqa: E402
from ultimat3.jobs.outbox import EnqueueOptions, build_job  # noqa: E402
from ultimat3.jobs.records import NewJob  # noqa: E402
from ultimat3.jobs.serialization import Serializer  # noqa: E402
from ultimat3.jobs.sql import queries  # noqa: E402


@job(name="bench.noop")
def noop(input: Any) -> None:
    return None


def _app(url: str) -> App:
    app = App(url, modules=[sys.modules[__name__]])
    app.open()  # open and migrate outside the timings
    return app


def _measure(
    label: str,
    app: App,
    conn: Any,
    business: str,
    bare: Callable[[], Any],
    statements: Callable[[], Any],
    n: int,
) -> None:
    """Time the five kinds of business transaction on ``conn`` (``business``: its INSERT,
    of one parameter; ``bare``: the bare INSERT of a job row; ``statements``: the joined
    enqueue's own statements, sent bare) and print what each adds."""

    def transaction(i: int, kind: int) -> None:
        if kind in (2, 3):
            with app.using(conn):
                conn.execute(business, (f"o{i}",))
                if kind == 2:
                    noop.enqueue({"order": i})
        else:
            conn.execute(business, (f"o{i}",))
            if kind == 1:
                bare()
            elif kind == 4:
                statements()
        conn.commit()

    alone, with_bare, ours, joined, floor = kinds_medians(n, transaction, 5)
    added_bare, added_ours = with_bare - alone, ours - alone
    print(
        f"{label}: tx alone {alone * 1e3:.3f} ms; bare INSERT adds {added_bare * 1e3:.3f} ms; "
        f"using()+enqueue adds {added_ours * 1e3:.3f} ms; ratio {added_ours / added_bare:.2f} "
        f"(using() alone adds {(joined - alone) * 1e3:.3f} ms; the enqueue's statements "
        f"alone add {(floor - alone) * 1e3:.3f} ms, ratio {(floor - alone) / added_bare:.2f})",
        flush=True,
    )


def _job() -> NewJob:
    """A job as ``noop.enqueue`` builds it, for the statements sent bare."""
    return build_job(noop, {"order": 0}, EnqueueOptions(), serializer=Serializer(), now=utcnow())


def sqlite_cost(rounds: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="u3bench-using-"))
    try:
        path = tmp / "jobs.sqlite3"
        app = _app(f"sqlite:///{path}")
        conn = sqlite3.connect(path)
        conn.execute("create table orders(id integer primary key, v text)")
        conn.commit()

        def bare() -> None:
            j = uuid7()
            conn.execute(BARE_JOB_INSERT, (j, j))

        job, ours, dialect = _job(), queries("sqlite"), queries("sqlite", "ultimat3.jobs.dialects")

        made = iter(
            [
                job_row(job._replace(id=j, idempotency_key=j), wall_ns() // 1000)
                for j in (uuid7() for _ in range(rounds + 20))
            ]
        )

        def statements() -> None:
            row = next(made)
            conn.execute(dialect["savepoint"])
            conn.execute(ours["clock_frame"]).fetchone()
            conn.execute(ours["job_insert"], row)
            conn.execute(ours["job_counts_add"], (row[3], row[7], 1))
            conn.execute(dialect["savepoint_release"])

        business = "insert into orders(v) values (?)"
        _measure("SQLite", app, conn, business, bare, statements, rounds)
        conn.close()
        app.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def postgres_cost(rounds: int) -> None:
    import psycopg
    from bench_pg import COLUMNS, ROW_VALUES, _row, _url

    from pgcluster import Cluster

    cluster = Cluster.create()
    try:
        dsn = cluster.dsn()
        app = _app(_url(dsn))
        bare_sql = f'INSERT INTO "ultimat3_jobs".x_jobs ({COLUMNS}) {ROW_VALUES}'
        with psycopg.connect(dsn) as conn:
            conn.execute("CREATE TABLE orders (id bigserial primary key, v text)")
            conn.commit()
            business = "INSERT INTO orders (v) VALUES (%s)"
            job, insert = _job(), app.driver._q["job_insert_one"]  # type: ignore[attr-defined]
            channel = app.driver._channel  # type: ignore[attr-defined]

            shared = _pg_params(job, channel)
            made = iter(
                [{**shared, "id": j, "key": j} for j in (uuid7() for _ in range(rounds + 20))]
            )

            def statements() -> None:
                params = next(made)
                conn.execute(SAVEPOINT_SQL)
                conn.execute(insert, params).fetchall()
                conn.execute(RELEASE_SQL)

            _measure(
                "PostgreSQL",
                app,
                conn,
                business,
                lambda: conn.execute(bare_sql, _row()),
                statements,
                rounds,
            )
        app.close()
    finally:
        cluster.close()


def _pg_params(j: NewJob, channel: str) -> dict[str, Any]:
    """The parameters of ``job_insert_one`` for ``j``, as the driver binds them."""
    return {
        "id": j.id, "name": j.name, "queue": j.queue, "input": j.input,
        "tenant_id": j.tenant_id, "key": j.idempotency_key, "priority": j.priority,
        "max_attempts": j.max_attempts, "trace_context": j.trace_context, "channel": channel,
        "run_at": j.run_at, "delay": j.delay, "now": None, "limit_key": j.limit_key,
        "limit_max": j.limit_max, "rate_max": j.rate_max,
        "rate_period": j.rate_period // timedelta(microseconds=1), "unique_key": j.unique_key,
        "unique_states": j.unique_states,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--driver", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=2000)
    args = parser.parse_args()
    for name, cost in (("sqlite", sqlite_cost), ("postgres", postgres_cost)):
        if args.driver in (name, "both"):
            cost(args.rounds)


if __name__ == "__main__":
    main()

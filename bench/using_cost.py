"""What ``with app.using(conn): handle.enqueue(x)`` adds to a business transaction, beside
what a bare INSERT of the same job row adds, on SQLite and PostgreSQL.

    python bench/using_cost.py                     # both databases, 2,000 rounds each
    python bench/using_cost.py --driver sqlite --rounds 500

Each round runs three fresh business transactions on the caller's own connection, in turns
(``run.kinds_medians``): the business INSERT alone; it and a bare INSERT into the job table;
it inside ``with app.using(conn):`` with one ``handle.enqueue``; and it inside ``using()``
with no enqueue (what joining alone costs). The added costs are medians minus the first
kind's median. Not a test: nothing here asserts.
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))

from run import BARE_JOB_INSERT, kinds_medians  # noqa: E402

from ultimat3.jobs import App, job  # noqa: E402
from ultimat3.jobs.ids import uuid7  # noqa: E402


@job(name="bench.noop")
def noop(input: Any) -> None:
    return None


def _app(url: str) -> App:
    app = App(url, modules=[sys.modules[__name__]])
    app.open()  # open and migrate outside the timings
    return app


def _measure(
    label: str, app: App, conn: Any, business: str, bare: Callable[[], Any], n: int
) -> None:
    """Time the four kinds of business transaction on ``conn`` (``business``: its INSERT,
    of one parameter; ``bare``: the bare INSERT of a job row) and print what each adds."""

    def transaction(i: int, kind: int) -> None:
        if kind >= 2:
            with app.using(conn):
                conn.execute(business, (f"o{i}",))
                if kind == 2:
                    noop.enqueue({"order": i})
        else:
            conn.execute(business, (f"o{i}",))
            if kind == 1:
                bare()
        conn.commit()

    alone, with_bare, ours, joined = kinds_medians(n, transaction, 4)
    added_bare, added_ours = with_bare - alone, ours - alone
    print(
        f"{label}: tx alone {alone * 1e3:.3f} ms; bare INSERT adds {added_bare * 1e3:.3f} ms; "
        f"using()+enqueue adds {added_ours * 1e3:.3f} ms; ratio {added_ours / added_bare:.2f} "
        f"(using() alone adds {(joined - alone) * 1e3:.3f} ms)",
        flush=True,
    )


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

        _measure("SQLite", app, conn, "insert into orders(v) values (?)", bare, rounds)
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
            _measure(
                "PostgreSQL", app, conn, business, lambda: conn.execute(bare_sql, _row()), rounds
            )
        app.close()
    finally:
        cluster.close()


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

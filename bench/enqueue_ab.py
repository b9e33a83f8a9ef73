"""Interleaved A/B of the enqueue path between two checkouts: bulk (``enqueue_many`` of 10,000,
5 calls), single (one commit each) and joined (one enqueue in a business transaction on the
caller's connection), on SQLite and on a throwaway PostgreSQL cluster (fsync on).

    python bench/enqueue_ab.py --a /path/to/old/src --b src --rounds 3

Each round runs one child process per checkout, in turns (A, B, then B, A in the next round),
each on a fresh database. A child reports wall time and its own CPU time
(``time.process_time``: the Python of the library, and SQLite's C library, not the server's).
Prints per row the median over rounds of each side, their spread (min-max), and B/A. Not a
test: nothing asserts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _child(url: str, dsn: str, singles: int, joined: int) -> dict[str, float]:
    """The measures of one checkout on one database (``url``): seconds per job, wall and CPU."""
    from ultimat3.jobs import App, job

    @job(name="noop")
    def noop(input: Any) -> None:
        return None

    module = types.ModuleType("enqueue_ab_jobs")
    module.noop = noop  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    app = App(url, modules=[module])
    app.open()
    out: dict[str, float] = {}

    def timed(name: str, n: int, run: Any) -> None:
        wall, cpu = time.perf_counter(), time.process_time()
        run()
        out[f"{name} wall us"] = (time.perf_counter() - wall) / n * 1e6
        out[f"{name} cpu us"] = (time.process_time() - cpu) / n * 1e6

    inputs = [{"i": i} for i in range(50_000)]
    app.enqueue_many(noop, inputs[:1000])  # warm

    def bulk() -> None:
        for at in range(0, 50_000, 10_000):
            app.enqueue_many(noop, inputs[at : at + 10_000])

    timed("bulk", 50_000, bulk)

    def single() -> None:
        with app:
            for i in range(singles):
                noop.enqueue({"i": i})

    with app:
        for i in range(50):
            noop.enqueue({"i": i})
    timed("single", singles, single)

    if url.startswith("sqlite"):
        import sqlite3

        conn: Any = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        conn.execute("pragma journal_mode=wal")
        conn.execute("pragma busy_timeout=30000")
        conn.execute("create table if not exists orders(id integer primary key, v text)")
        begin = "begin immediate"
        order = "insert into orders(v) values (?)"
    else:
        import psycopg

        conn = psycopg.connect(dsn)
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial primary key, v text)")
        conn.commit()
        begin = ""
        order = "INSERT INTO orders (v) VALUES (%s)"

    def business(i: int, enqueue: bool) -> None:
        if begin:
            conn.execute(begin)
        with app.using(conn):
            conn.execute(order, (f"o{i}",))
            if enqueue:
                noop.enqueue({"order": i})
        conn.commit()

    for i in range(50):
        business(i, True)
    # Interleaved: a transaction alone, then one with an enqueue; the difference is the
    # enqueue's added cost.
    spent = {False: [0.0, 0.0], True: [0.0, 0.0]}
    for i in range(joined):
        for enqueue in (False, True):
            wall, cpu = time.perf_counter(), time.process_time()
            business(i, enqueue)
            spent[enqueue][0] += time.perf_counter() - wall
            spent[enqueue][1] += time.process_time() - cpu
    out["joined added wall us"] = (spent[True][0] - spent[False][0]) / joined * 1e6
    out["joined added cpu us"] = (spent[True][1] - spent[False][1]) / joined * 1e6
    conn.close()
    app.close()
    return out


def _run_child(src: str, url: str, dsn: str, args: argparse.Namespace) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": src}
    command = [sys.executable, __file__, "--child", url, "--dsn", dsn]
    command += ["--singles", str(args.singles), "--joined", str(args.joined)]
    if args.cpu is not None:
        command = ["taskset", "-c", str(args.cpu), *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"child failed ({src}, {url}):\n{done.stderr}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def _url(dsn: str) -> str:
    from psycopg.conninfo import conninfo_to_dict

    p = conninfo_to_dict(dsn)
    return f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--a", help="the old checkout's src")
    parser.add_argument("--b", help="the new checkout's src")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--singles", type=int, default=1000)
    parser.add_argument("--joined", type=int, default=1000)
    parser.add_argument("--driver", choices=["sqlite", "postgres", "all"], default="all")
    parser.add_argument("--cpu", type=int, default=None, help="pin the children to this core")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--dsn", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.child, args.dsn, args.singles, args.joined)))
        return
    sys.path.insert(0, str(HERE.parent / "tests"))
    tmp = Path(tempfile.mkdtemp(prefix="u3ab-"))
    cluster = None
    drivers = ["sqlite", "postgres"] if args.driver == "all" else [args.driver]
    figures: dict[tuple[str, str, str], list[float]] = {}
    try:
        if "postgres" in drivers:
            import psycopg

            from pgcluster import Cluster

            cluster = Cluster.create()
        n = 0
        for r in range(args.rounds):
            sides = [("A", args.a), ("B", args.b)]
            for side, src in sides if r % 2 == 0 else sides[::-1]:
                for driver in drivers:
                    n += 1
                    if driver == "sqlite":
                        url, dsn = f"sqlite:///{tmp / f'ab{n}.sqlite3'}", ""
                    else:
                        assert cluster is not None
                        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:
                            admin.execute(f"CREATE DATABASE ab{n}")
                        dsn = str(cluster.dsn(f"ab{n}"))
                        url = _url(dsn)
                    got = _run_child(src, url, dsn, args)
                    print(f"round {r} {side} {driver}: " + ", ".join(
                        f"{k} {v:.1f}" for k, v in got.items()), flush=True)  # fmt: skip
                    for key, value in got.items():
                        figures.setdefault((driver, key, side), []).append(value)
                    if driver == "postgres":
                        with psycopg.connect(cluster.dsn(), autocommit=True) as admin:  # type: ignore[union-attr]
                            admin.execute(f"DROP DATABASE ab{n}")
        print(
            f"\n{'driver':<9}{'measure':<24}{'A median (min-max)':>26}{'B median (min-max)':>26}  B/A"
        )
        for driver in drivers:
            keys = sorted({k for d, k, _ in figures if d == driver})
            for key in keys:
                a, b = figures[(driver, key, "A")], figures[(driver, key, "B")]
                ma, mb = statistics.median(a), statistics.median(b)
                print(
                    f"{driver:<9}{key:<24}{ma:>10.1f} ({min(a):.1f}-{max(a):.1f})"
                    f"{mb:>12.1f} ({min(b):.1f}-{max(b):.1f})  {mb / ma:.2f}"
                )
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

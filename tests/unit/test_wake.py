"""``Wake`` and ``FileWatch``, and the SQLite waiter that sleeps on them instead of polling."""

from __future__ import annotations

import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ultimat3.jobs.drivers.sqlite import SqliteDriver
from ultimat3.jobs.wake import FileWatch, Wake

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="inotify is Linux's")


def readable(fd: int) -> bool:
    return bool(select.select([fd], [], [], 0)[0])


def test_wake_is_readable_while_set_and_not_after_clear() -> None:
    wake = Wake()
    assert not readable(wake.fileno())
    wake.set()
    wake.set()  # twice: still one state, and clear() empties it
    assert wake.is_set() and readable(wake.fileno())
    wake.clear()
    assert not wake.is_set() and not readable(wake.fileno())
    assert wake.wait(0.01) is False


def test_wake_set_from_another_thread_ends_a_select() -> None:
    wake = Wake()
    threading.Timer(0.1, wake.set).start()
    started = time.monotonic()
    ready, _, _ = select.select([wake.fileno()], [], [], 10)
    assert ready and time.monotonic() - started < 5


@linux_only
def test_file_watch_sees_a_write_from_another_process_and_only_its_files(tmp_path: Path) -> None:
    watch = FileWatch.open(str(tmp_path), ["db-wal"])
    assert watch is not None
    (tmp_path / "other.log").write_text("not watched")
    assert watch.drain() is False
    code = f"open({str(tmp_path / 'db-wal')!r}, 'ab').write(b'frame')"
    subprocess.run([sys.executable, "-c", code], check=True)
    assert watch.wait(10) is True
    assert watch.wait(0.05) is False  # drained: nothing new


@linux_only
def test_file_watch_wait_returns_when_woken(tmp_path: Path) -> None:
    watch = FileWatch.open(str(tmp_path), ["db-wal"])
    assert watch is not None
    wake = Wake()
    threading.Timer(0.1, wake.set).start()
    started = time.monotonic()
    assert watch.wait(10, wake) is False
    assert time.monotonic() - started < 5


def test_file_watch_of_a_missing_directory_is_none(tmp_path: Path) -> None:
    assert FileWatch.open(str(tmp_path / "missing"), ["db-wal"]) is None


@linux_only
def test_sqlite_waiter_sleeps_in_the_kernel_and_wakes_on_another_process_commit(
    tmp_path: Path,
) -> None:
    """With a ``Wake``, an idle wait reads ``data_version`` a handful of times, not once per
    millisecond; a commit by another process still ends it at once."""
    path = tmp_path / "jobs.sqlite3"
    driver = SqliteDriver(str(path))
    driver.migrate()
    looks = 0

    def counted(statement: str) -> None:
        nonlocal looks
        looks += statement.startswith("PRAGMA data_version")

    wake = Wake()
    driver.wait_for_jobs(0.0, wake)  # first use: opens the watch, records the version
    driver._local.waiter.conn.set_trace_callback(counted)  # the waiting thread's connection
    looks = 0
    started = time.monotonic()
    driver.wait_for_jobs(1.0, wake)
    assert time.monotonic() - started >= 0.9
    assert looks <= 3, f"an idle second read data_version {looks} times: it polled"

    code = (
        f"import sqlite3, time; time.sleep(0.3); c = sqlite3.connect({str(path)!r});"
        " c.execute(\"INSERT INTO x_queues (name, paused, updated_at) VALUES ('q', 1, 0)\");"
        " c.commit()"
    )
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        started = time.monotonic()
        driver.wait_for_jobs(30.0, wake)
        assert time.monotonic() - started < 10, "the other process's commit did not end the wait"
    finally:
        child.wait(30)
    driver.close()

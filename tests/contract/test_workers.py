"""Live workers: a row per worker process, refreshed by its heartbeat, removed on a clean
exit, pruned once stale (``worker_beat``, ``worker_remove``, ``worker_prune``,
``worker_list``)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from ultimat3.jobs.driver import Driver
from ultimat3.jobs.records import WorkerInfo

T0 = datetime(2030, 1, 1, 12, 0, tzinfo=UTC)


def _info(worker_id: str, *, queues: tuple[str, ...] = ("default",)) -> WorkerInfo:
    host, pid, _ = worker_id.split(":")
    return WorkerInfo(
        id=worker_id,
        host=host,
        pid=int(pid),
        queues=queues,
        concurrency=4,
        started_at=T0,
        heartbeat_at=T0,
        version="1.2.3",
    )


def test_beat_inserts_then_refreshes(driver: Driver) -> None:
    assert driver.worker_list() == []
    driver.worker_beat(_info("h1:10:aaaaaa", queues=("a", "b,c")), now=T0)
    driver.worker_beat(_info("h0:11:bbbbbb"), now=T0 + timedelta(seconds=1))
    listed = driver.worker_list()
    assert [w.id for w in listed] == ["h0:11:bbbbbb", "h1:10:aaaaaa"]
    first = listed[1]
    assert first == WorkerInfo("h1:10:aaaaaa", "h1", 10, ("a", "b,c"), 4, T0, T0, "1.2.3")
    assert listed[0].heartbeat_at == T0 + timedelta(seconds=1)

    driver.worker_beat(_info("h1:10:aaaaaa", queues=("a", "b,c")), now=T0 + timedelta(seconds=5))
    again = {w.id: w for w in driver.worker_list()}["h1:10:aaaaaa"]
    assert again.heartbeat_at == T0 + timedelta(seconds=5)
    assert again.started_at == T0


def test_beat_on_the_database_clock(driver: Driver) -> None:
    before = datetime.now(UTC) - timedelta(seconds=5)
    driver.worker_beat(_info("h:1:cccccc"))
    (row,) = driver.worker_list()
    assert before <= row.heartbeat_at <= datetime.now(UTC) + timedelta(seconds=5)


def test_remove_and_prune(driver: Driver) -> None:
    driver.worker_beat(_info("h:1:old000"), now=T0)
    driver.worker_beat(_info("h:2:new000"), now=T0 + timedelta(seconds=50))
    driver.worker_beat(_info("h:3:gone00"), now=T0 + timedelta(seconds=50))
    driver.worker_remove("h:3:gone00")
    driver.worker_remove("h:9:absent")  # nothing to remove: no error
    assert driver.worker_prune(timedelta(seconds=30), now=T0 + timedelta(seconds=40)) == [
        "h:1:old000"
    ]
    assert [w.id for w in driver.worker_list()] == ["h:2:new000"]
    assert driver.worker_prune(timedelta(seconds=30), now=T0 + timedelta(seconds=40)) == []

"""The worker's cycle runs on one supervised loop that feeds the handler threads: every
``job_cycle`` (write the outcomes, claim for the free slots, in one transaction) is the loop's,
and a handler thread only runs jobs. Runs on each database the suite is given."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from ultimat3.jobs import App, events, job
from ultimat3.jobs.records import Cycle

_ran_on: list[str] = []


@job(name="cycle_loop_noop")
def noop(input: dict[str, Any]) -> None:
    _ran_on.append(threading.current_thread().name)


def test_the_cycle_loop_writes_and_claims_and_the_handler_threads_only_run_jobs(
    make_app: Callable[..., App], make_module: Callable[..., Any]
) -> None:
    app = make_app(make_module(noop=noop))
    worker = app.worker(concurrency=3, poll_interval="50ms")
    driver = worker.driver
    cycled_on: set[str] = set()
    turns: list[tuple[int, int]] = []  # (outcomes written, jobs claimed) per transaction

    class Watched:
        def __getattr__(self, name: str) -> Any:
            return getattr(driver, name)

        def job_cycle(self, cycle: Cycle, **kwargs: Any) -> Any:
            cycled_on.add(threading.current_thread().name)
            result = driver.job_cycle(cycle, **kwargs)
            turns.append((len(cycle.completes), len(result.claimed)))
            return result

    worker.driver = Watched()  # type: ignore[assignment]
    _ran_on.clear()
    ids = [noop.enqueue({"n": n}).id for n in range(30)]
    completed: list[object] = []
    all_done = threading.Event()

    def on_completed(event: object) -> None:
        completed.append(event)
        if len(completed) == len(ids):
            all_done.set()

    with events.subscribe(on_completed, names=["jobs.job.completed"]), worker:
        assert all_done.wait(30), f"{len(completed)} of {len(ids)} jobs completed in 30 s"
        threads = [t.name for t in threading.enumerate() if t.name.startswith("ultimat3-jobs-")]
    assert app.count_jobs(state="completed") == len(ids)
    assert cycled_on == {"ultimat3-jobs-cycle"}
    assert len(_ran_on) == len(ids)
    assert all(name.startswith("ultimat3-jobs-handler-") for name in _ran_on)
    # Every job claimed once and its completion written once, by the loop's transactions.
    assert sum(claimed for _, claimed in turns) == len(ids)
    assert sum(written for written, _ in turns) == len(ids)
    assert threads.count("ultimat3-jobs-cycle") == 1
    assert len([n for n in threads if n.startswith("ultimat3-jobs-handler-")]) == 3

"""The skip list of unknown job names under its two writers: a handler thread records a skip
while the cycle thread reads the list. (Before, the cycle copied a shared dict, then removed
the names whose skip had ended: a skip a handler renewed in between was removed with the old
one, and the worker claimed the unknown name again at once.) The names are now part of the
worker's lifecycle (``run.Life``), a value each skip replaces: the cycle reads one value, and
a skip applied meanwhile is in the next."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ultimat3.jobs import App, job
from ultimat3.jobs.run import Skip
from ultimat3.jobs.testing import FakeClock


@job
def known(input: Any) -> None:
    return None


def test_a_skip_written_while_the_cycle_reads_the_list_is_kept(
    make_module: Callable[..., Any],
) -> None:
    clock = FakeClock()
    app = App("memory://", modules=[make_module("skip_race", known=known)], clock=clock)
    try:
        worker = app.worker()
        worker._apply(Skip("deploy.newer", 60.0))
        clock.advance(120)
        read = worker._life  # the cycle's reading
        worker._apply(Skip("deploy.newer", 180.0))  # a handler renews the skip meanwhile
        assert "deploy.newer" in read.skipping
        assert worker._skipped() == ("deploy.newer",), "the renewed skip holds"
        clock.advance(61)
        assert worker._skipped() == (), "the renewed skip ended"
    finally:
        app.close()

"""The skip list of unknown job names (``Worker._skipping``) under its two writers: a handler
thread records a skip while the cycle thread reads the list. (Before, the cycle copied the
list, then removed the names whose skip had ended: a skip a handler renewed in between was
removed with the old one, and the worker claimed the unknown name again at once.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ultimat3.jobs import App, job
from ultimat3.jobs.testing import FakeClock


@job
def known(input: Any) -> None:
    return None


class _HandlerWritesDuringCopy(dict[str, float]):
    """A skip list whose ``copy`` lets a handler thread renew ``name``'s skip just after it:
    the interleaving the race needs, made certain."""

    def __init__(self, name: str, until: float, renewed: float) -> None:
        super().__init__({name: until})
        self.name, self.renewed = name, renewed

    def copy(self) -> dict[str, float]:
        copied = dict(self)
        self[self.name] = self.renewed
        return copied


def test_a_skip_written_while_the_cycle_reads_the_list_is_kept(
    make_module: Callable[..., Any],
) -> None:
    clock = FakeClock()
    app = App("memory://", modules=[make_module("skip_race", known=known)], clock=clock)
    try:
        worker = app.worker()
        clock.advance(120)
        worker._skipping = _HandlerWritesDuringCopy("deploy.newer", 60.0, 180.0)
        assert worker._skipped() == (), "the old skip ended"
        assert worker._skipped() == ("deploy.newer",), "the renewed skip holds"
    finally:
        app.close()

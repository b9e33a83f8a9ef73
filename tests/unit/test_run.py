"""The run state machine (``ultimat3.jobs.run``), driven through every interleaving of
start, finish, timeout, heartbeat loss, shutdown release and handler return: a run is settled
(or released) at most once, never starts after its release, and frees its slot only when
nothing runs for it any more."""

from __future__ import annotations

import threading
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ultimat3.jobs.run import Run, RunState


class RunMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.run: Run[str] = Run()
        self.started = 0
        self.outcomes: list[str] = []
        self.released = 0
        self.returned = False

    @rule()
    def start(self) -> None:
        if self.run.start():
            self.started += 1

    @rule(outcome=st.sampled_from(["complete", "fail", "timeout", "lease-lost", "release"]))
    def settle(self, outcome: str) -> None:
        if self.run.settle(outcome):
            self.outcomes.append(outcome)

    @rule()
    def release(self) -> None:
        if self.run.release():
            self.released += 1

    @precondition(lambda self: self.started == 1 and not self.returned)
    @rule()
    def handler_returns(self) -> None:
        self.run.returned()
        self.returned = True

    @invariant()
    def settled_at_most_once(self) -> None:
        assert len(self.outcomes) + self.released <= 1

    @invariant()
    def never_starts_after_release_or_twice(self) -> None:
        assert self.started <= 1
        if self.released:
            assert self.started == 0

    @invariant()
    def the_slot_frees_only_when_nothing_runs(self) -> None:
        if self.run.free:
            assert self.released == 1 or (
                len(self.outcomes) == 1 and (self.returned or self.started == 0)
            )
        if self.started and not self.returned:
            assert not self.run.free, "a started handler holds its lease until it returns"

    @invariant()
    def the_outcome_is_the_first_settlers(self) -> None:
        if self.outcomes:
            assert self.run.outcome == self.outcomes[0]
            assert self.run.state is RunState.SETTLED


TestRunMachine = RunMachine.TestCase


def test_racing_threads_settle_a_run_once() -> None:
    for _ in range(200):
        run: Run[int] = Run()
        run.start()
        wins: list[int] = []
        barrier = threading.Barrier(4)

        def settle(
            n: int, run: Run[int] = run, wins: list[int] = wins, barrier: Any = barrier
        ) -> None:
            barrier.wait()
            if run.settle(n):
                wins.append(n)

        threads = [threading.Thread(target=settle, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1 and run.outcome == wins[0]


def test_a_release_and_a_start_never_both_win() -> None:
    for _ in range(200):
        run: Run[int] = Run()
        results: dict[str, bool] = {}
        barrier = threading.Barrier(2)

        def go(
            name: str, action: object, results: dict[str, bool] = results, barrier: Any = barrier
        ) -> None:
            barrier.wait()
            results[name] = action()  # type: ignore[operator]

        a = threading.Thread(target=go, args=("start", run.start))
        b = threading.Thread(target=go, args=("release", run.release))
        a.start()
        b.start()
        a.join()
        b.join()
        assert results["start"] != results["release"]

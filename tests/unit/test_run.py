"""The worker's pure state machines (``ultimat3.jobs.run``).

``Run``, driven through every interleaving of start, finish, timeout, lease loss (renewal
refused or a fenced write), renewal confirmations, shutdown release, the outcome's write and
the handler's return: a run is settled (or released) at most once, never starts after its
release, is lost and timed out at most once, and frees its slot only when nothing runs for it
and nothing is left to write.

``Life``, driven through every sequence of starts, stops, hard stops, signals, fatal errors,
the end of a drain and skips: the worker drains before it stops, a hard stop stays hard until
the next start, the second signal is a hard stop, a fatal error's exit code stays until the
next start, and a skip is never lost."""

from __future__ import annotations

import threading
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ultimat3.jobs.run import (
    Fatal,
    Life,
    Phase,
    Run,
    RunState,
    Signal,
    Skip,
    Start,
    Stop,
    StopNow,
    Stopped,
    skipped,
    transition,
)


class RunMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.run: Run[str] = Run(confirmed=1.0)
        self.started = 0
        self.outcomes: list[str] = []
        self.released = 0
        self.returned = False
        self.losses = 0
        self.timeouts = 0
        self.wrote = False
        self.moot = False  # settled by a loss: nothing to write
        self.confirmations = [1.0]

    @rule()
    def start(self) -> None:
        if self.run.start():
            self.started += 1

    @rule(outcome=st.sampled_from(["complete", "fail", "timeout", "snooze"]))
    def settle(self, outcome: str) -> None:
        if self.run.settle(outcome):
            self.outcomes.append(outcome)

    @rule()
    def release(self) -> None:
        if self.run.release("release"):
            self.released += 1

    @rule()
    def time_out(self) -> None:
        settled = self.run.settled
        if self.run.time_out():
            assert not settled, "only an unsettled run times out"
            self.timeouts += 1

    @rule()
    def lose(self) -> None:
        settled = self.run.settled
        if self.run.lose("lost"):
            self.losses += 1
            if not settled:
                self.outcomes.append("lost")
                self.moot = True

    @rule(at=st.floats(min_value=0.0, max_value=100.0))
    def confirm(self, at: float) -> None:
        self.run.confirm(at)
        self.confirmations.append(at)

    @precondition(lambda self: self.run.settled)
    @rule()
    def write(self) -> None:
        self.run.wrote()
        self.wrote = True

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
    def lost_and_timed_out_at_most_once(self) -> None:
        assert self.losses <= 1 and self.timeouts <= 1
        assert self.run.lost is (self.losses == 1)
        assert self.run.timed_out is (self.timeouts == 1)

    @invariant()
    def a_lease_lasts_from_its_latest_confirmation(self) -> None:
        assert self.run.confirmed == max(self.confirmations)

    @invariant()
    def the_slot_frees_only_when_nothing_runs_and_nothing_is_left_to_write(self) -> None:
        written = self.wrote or self.moot
        if self.run.free:
            assert written
            assert self.released == 1 or (
                len(self.outcomes) == 1 and (self.returned or self.started == 0)
            )
        elif written and (self.released or (self.outcomes and (self.returned or not self.started))):
            raise AssertionError("nothing runs and nothing is left to write: the slot is free")
        if self.started and not self.returned:
            assert not self.run.free, "a started handler holds its lease until it returns"

    @invariant()
    def the_outcome_is_the_first_settlers(self) -> None:
        if self.outcomes:
            assert self.run.outcome == self.outcomes[0]
            assert self.run.state is RunState.SETTLED
        if self.released:
            assert self.run.outcome == "release"
            assert self.run.state is RunState.RELEASED


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
        b = threading.Thread(target=go, args=("release", lambda run=run: run.release(0)))
        a.start()
        b.start()
        a.join()
        b.join()
        assert results["start"] != results["release"]


def test_racing_threads_lose_a_lease_once() -> None:
    """The renew loop and the cycle (a fenced write) may give up the same lease together."""
    for _ in range(200):
        run: Run[int] = Run()
        run.start()
        wins: list[int] = []
        barrier = threading.Barrier(3)

        def lose(
            n: int, run: Run[int] = run, wins: list[int] = wins, barrier: Any = barrier
        ) -> None:
            barrier.wait()
            if run.lose(n):
                wins.append(n)

        threads = [threading.Thread(target=lose, args=(n,)) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(wins) == 1 and run.outcome == wins[0] and run.written


# -- the worker's lifecycle ----------------------------------------------------------------------

GRACE = 10.0


class LifeMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.life = Life()
        self.skips: dict[str, float] = {}

    def _go(self, event: object) -> tuple[Life, Life]:
        before = self.life
        self.life = transition(before, event)  # type: ignore[arg-type]
        return before, self.life

    @rule()
    def start(self) -> None:
        before, after = self._go(Start())
        if before.phase is Phase.STOPPED:
            assert after.phase is Phase.RUNNING and not after.hard and after.exit_code == 0
        else:
            assert after == before, "a start while running or draining changes nothing"

    @rule(grace=st.floats(min_value=0, max_value=60))
    def stop(self, grace: float) -> None:
        before, after = self._go(Stop(grace))
        assert after.hard == before.hard
        if before.phase is Phase.RUNNING:
            assert after.phase is Phase.DRAINING and after.grace == grace
        else:
            assert after.phase is before.phase and after.grace == before.grace

    @rule()
    def stop_now(self) -> None:
        before, after = self._go(StopNow(GRACE))
        assert after.hard
        assert after.phase is (Phase.DRAINING if before.phase is Phase.RUNNING else before.phase)

    @rule()
    def signal(self) -> None:
        before, after = self._go(Signal(GRACE))
        assert after.signals == before.signals + 1
        if before.phase is Phase.RUNNING:
            assert after.phase is Phase.DRAINING
        assert after.hard == (before.hard or after.signals > 1), "the second signal is hard"

    @rule()
    def fatal(self) -> None:
        _, after = self._go(Fatal(70, GRACE))
        assert after.hard and after.exit_code == 70
        assert after.phase is not Phase.RUNNING

    @rule()
    def stopped(self) -> None:
        before, after = self._go(Stopped())
        assert after.phase is Phase.STOPPED
        assert after.exit_code == before.exit_code, "the exit code outlives the stop"

    @rule(name=st.sampled_from(["a", "b"]), until=st.floats(min_value=0, max_value=100))
    def skip(self, name: str, until: float) -> None:
        before, after = self._go(Skip(name, until))
        self.skips[name] = until
        assert before.skipping.get(name) != until or after.skipping[name] == until

    @invariant()
    def a_skip_is_never_lost(self) -> None:
        assert dict(self.life.skipping) == self.skips
        for now in (0.0, 50.0, 100.0):
            expected = tuple(sorted(n for n, u in self.skips.items() if u > now))
            assert skipped(self.life, now) == expected

    @invariant()
    def only_a_drain_is_hard(self) -> None:
        if self.life.phase is Phase.RUNNING:
            assert not self.life.hard


TestLifeMachine = LifeMachine.TestCase


def test_a_skip_applied_while_the_cycle_reads_the_names_is_kept() -> None:
    """The skipped names are a value: the cycle reads one state while a handler makes the
    next, and neither loses the other's (the race of a shared dict, tests/app/test_skip_race)."""
    life = transition(Life(), Skip("deploy.newer", 60.0))
    read = life  # the cycle's snapshot
    life = transition(life, Skip("deploy.newer", 180.0))  # a handler renews it meanwhile
    assert skipped(read, 120.0) == ()
    assert skipped(life, 120.0) == ("deploy.newer",)

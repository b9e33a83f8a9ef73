"""A rescuer started after a step of the wall clock: it cannot see the step (its process did
not run then: a supervisor's restart, a pool's child, a deploy), so it trusts no lease expiry
for one lease after it starts, time in which a live worker renews its leases. (Before, its
first pass rescued every live job whose lease was renewed in the old time: on SQLite, whose
leases are on the host's clock, those jobs ran twice.)"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

from ultimat3.jobs import App, job
from ultimat3.jobs.maintenance import Maintenance
from ultimat3.jobs.records import ClaimParams, Cycle, JobState
from ultimat3.jobs.testing import FakeClock

LEASE = timedelta(seconds=30)


@job
def step_job(input: Any) -> None:
    return None


def test_a_rescuer_started_after_a_step_rescues_no_live_job(
    make_app: Callable[..., App], make_module: Callable[..., Any]
) -> None:
    old = FakeClock()  # the running worker's process: it sees the step
    app = make_app(make_module("rescue_after_start", step_job=step_job), clock=old)
    live, dead = step_job.enqueue({}), step_job.enqueue({})
    params = ClaimParams(("default",), 2, LEASE, worker_id="w", now=old.now())
    claimed = app.driver.job_cycle(Cycle(claim=params), now=old.now()).claimed
    assert sorted(j.id for j in claimed) == sorted([live.id, dead.id])
    leases = {j.id: j.lease for j in claimed}
    old.advance(20)
    app.driver.lease_extend(list(leases.values()), LEASE, now=old.now())  # renewed on time
    old.step(timedelta(hours=2))

    # A process started after the step: its clock reads the new time and saw no step.
    fresh = FakeClock(old.now())
    assert fresh.stepped_at() == -float("inf")
    rescuer = Maintenance(app.driver, lambda name: None, fresh, grace=LEASE)
    assert rescuer.rescue() == [], "a live job's lease renewed before the step is not rescued"
    fresh.advance(10)
    old.advance(10)  # the live worker's next heartbeat, in the new time
    assert app.driver.lease_extend([leases[live.id]], LEASE, now=old.now()) == {live.id}
    fresh.advance(LEASE.total_seconds() - 10 - 1)
    assert rescuer.rescue() == [], "still within one lease of the rescuer's start"
    fresh.advance(2)  # a full lease since the start: the unrenewed lease is rescued, as usual
    assert rescuer.rescue() == [dead.id]
    assert app.get_job(live.id).state is JobState.RUNNING
    assert [e.kind for e in app.get_job(dead.id).errors] == ["worker_lost"]


def test_a_rescuer_running_before_a_crash_keeps_the_lease_bound(
    make_app: Callable[..., App], make_module: Callable[..., Any]
) -> None:
    """The grace is counted from the rescuer's start, not from the lease's expiry: a standby
    that was running when the worker died rescues its job as soon as the lease expires."""
    clock = FakeClock()
    app = make_app(make_module("rescue_standby", step_job=step_job), clock=clock)
    rescuer = Maintenance(app.driver, lambda name: None, clock, grace=LEASE)
    clock.advance(LEASE)
    made = step_job.enqueue({})
    params = ClaimParams(("default",), 1, LEASE, worker_id="gone", now=clock.now())
    app.driver.job_cycle(Cycle(claim=params), now=clock.now())
    clock.advance(LEASE - timedelta(seconds=1))
    assert rescuer.rescue() == []
    clock.advance(2)
    assert rescuer.rescue() == [made.id]

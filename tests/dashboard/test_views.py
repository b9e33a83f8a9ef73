"""What the pages read, on an App over the memory driver: the bounded text search and its
continuation, the retry plan of a job page, the bulk action's limits, the filter's errors."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta

import dashjobs  # type: ignore[import-not-found]
import pytest

from ultimat3.jobs import App
from ultimat3.jobs.dashboard import views
from ultimat3.jobs.errors import ConfigurationError
from ultimat3.jobs.records import JobState


@pytest.fixture
def app() -> Iterator[App]:
    made = App("memory://", modules=[sys.modules["dashjobs"]])
    yield made
    made.close()


def test_a_text_search_stops_at_its_time_budget_and_goes_on_from_there(app: App) -> None:
    ids = [
        r.id for r in app.enqueue_many(dashjobs.send_mail, [{"to": f"u{i}"} for i in range(600)])
    ]
    needle = app.enqueue(dashjobs.send_mail, {"to": "needle"}).id  # the newest
    oldest = ids[0]
    page = views.jobs_page(app, views.Filters(text="NEEDLE"), None)
    assert [j.id for j in page.jobs] == [needle] and page.next_before is None
    assert page.scanned == 601 and not page.budget_spent
    # With no time at all, one batch is read, and the page says where to go on from.
    no_time = views.Budget(scan_seconds=0.0)
    first = views.jobs_page(app, views.Filters(text="u0"), None, no_time)
    assert first.budget_spent and first.scanned == 250 and first.next_before is not None
    found, pages, before = [j.id for j in first.jobs], 1, first.next_before
    while before is not None:
        more = views.jobs_page(app, views.Filters(text="u0"), before, no_time)
        found += [j.id for j in more.jobs]
        pages, before = pages + 1, more.next_before
    assert pages == 3  # 601 jobs, 250 a window
    assert oldest in found  # "u0" is the oldest job's input, past the first two windows


def test_a_text_search_reads_errors_too(app: App) -> None:
    job = app.get_job(app.enqueue(dashjobs.send_mail, {"to": "x"}).id)
    from ultimat3.jobs.records import AttemptError

    failed = type(job)(
        **{
            **{f: getattr(job, f) for f in job.__dataclass_fields__},
            "errors": (
                AttemptError(1, job.created_at, "RuntimeError", "card declined", "Traceback: deep"),
            ),
        }
    )
    assert views.matches_text(failed, "DECLINED")
    assert views.matches_text(failed, "runtimeerror")
    assert views.matches_text(failed, "deep")
    assert not views.matches_text(job, "declined")


def test_the_job_page_plans_the_rest_of_the_retry_schedule(app: App) -> None:
    job = app.get_job(app.enqueue(dashjobs.report, {"day": "monday"}).id)
    detail = views.job_detail(app, job)
    assert detail.registered and detail.next_run == job.run_at
    # attempts=5, exponential from 10s: the first run, then waits of 10s, 20s, 40s, 80s.
    assert [p.attempt for p in detail.plan] == [1, 2, 3, 4, 5]
    assert [p.wait for p in detail.plan] == [
        None,
        timedelta(seconds=10),
        timedelta(seconds=20),
        timedelta(seconds=40),
        timedelta(seconds=80),
    ]
    assert detail.plan[-1].earliest == job.run_at + timedelta(seconds=150)
    assert '"day": "monday"' in detail.input_text


def test_bulk_actions_are_bounded_and_refuse_what_they_cannot_do(app: App) -> None:
    with pytest.raises(ConfigurationError, match="cannot use a text search"):
        views.bulk_ids(app, views.Filters(state="dead", text="x"), "retry")
    with pytest.raises(
        ConfigurationError,
        match="only dead or cancelled jobs can be retried, and the filter is available",
    ):
        views.bulk_ids(app, views.Filters(state="available"), "retry")
    for i in range(3):
        app.cancel_job(app.enqueue(dashjobs.send_mail, {"to": f"c{i}"}).id)
    ids, more = views.bulk_ids(app, views.Filters(state="cancelled"), "retry")
    assert len(ids) == 3 and not more
    ids, more = views.bulk_ids(app, views.Filters(), "discard")  # dead or cancelled
    assert len(ids) == 3 and not more
    ids, more = views.bulk_ids(app, views.Filters(), "discard", views.Budget(bulk_limit=2))
    assert len(ids) == 2 and more


def test_an_unknown_state_in_the_filter_is_explained() -> None:
    with pytest.raises(ConfigurationError) as raised:
        views.Filters.parse({"state": "zombie"}, tenant=None)
    assert raised.value.cause == "'zombie' is not a job state"
    scoped = views.Filters.parse({"tenant": "globex"}, tenant="acme")
    assert scoped.tenant == "acme"
    assert views.Filters.parse({"state": "dead"}, tenant=None).job_filter().states == frozenset(
        {JobState.DEAD}
    )


def test_a_selective_filter_reads_window_by_window(app: App) -> None:
    rare = app.enqueue(dashjobs.send_mail, {"to": "rare"}, tenant_id="rare").id  # the oldest
    app.enqueue_many(dashjobs.send_mail, [{"to": f"u{i}"} for i in range(450)])
    small = views.Budget(window=100)
    found = views.jobs_page(app, views.Filters(tenant="rare"), None, small)
    assert [j.id for j in found.jobs] == [rare] and found.next_before is None
    # Out of time after the first window: the page says where it stopped, and going on from
    # there reaches the job.
    no_time = views.Budget(window=100, scan_seconds=0.0)
    first = views.jobs_page(app, views.Filters(tenant="rare"), None, no_time)
    assert first.jobs == [] and first.budget_spent and first.next_before is not None
    pages, page = 1, first
    while page.next_before is not None and not page.jobs:
        page = views.jobs_page(app, views.Filters(tenant="rare"), page.next_before, no_time)
        pages += 1
    assert [j.id for j in page.jobs] == [rare]
    assert pages == 5  # 451 jobs, 100 a window

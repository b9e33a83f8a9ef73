"""The dashboard in a real browser: Chromium (Debian's) against the live server of
``conftest.site``, on SQLite and on PostgreSQL, with a real worker process.

Each test saves a screenshot of every page it visits under ``tests/dashboard/screenshots/``.
"""

from __future__ import annotations

import re
import socket
import time
from datetime import UTC, datetime
from typing import Any

import dashjobs  # type: ignore[import-not-found]
from playwright.sync_api import expect

from ultimat3.jobs.ids import uuid7
from ultimat3.jobs.records import Fire, JobState, NewJob

from .conftest import Site, wait_until

XSS_QUEUE = "<script>alert('queue')</script>"
XSS_INPUT = "<script>alert('input')</script><img src=x onerror=alert('img')>"


def _state(site: Site, job_id: str) -> JobState:
    return site.app.get_job(job_id).state


def _dead_charge(site: Site, customer: str, tenant: str | None = None) -> str:
    job_id = site.app.enqueue(dashjobs.charge, {"customer": customer}, tenant_id=tenant).id
    wait_until(lambda: _state(site, job_id) is JobState.DEAD, 30, f"{job_id} to die")
    return job_id


def test_every_page_renders_and_refreshes_live(site: Site, page: Any) -> None:
    """A tour that saves a screenshot of each page with data on it."""
    app = site.app
    done = [
        r.id
        for r in app.enqueue_many(
            dashjobs.send_mail, [{"to": f"u{i}@example.com"} for i in range(8)]
        )
    ]
    wait_until(lambda: all(_state(site, i) is JobState.COMPLETED for i in done), 30, "mail")
    dead = _dead_charge(site, "tour")
    failing = app.enqueue(dashjobs.report, {"day": "monday"}).id
    wait_until(
        lambda: app.get_job(failing).attempt >= 1 and _state(site, failing) is JobState.SCHEDULED,
        30,
        "a retry",
    )

    page.goto(site.base + "/")
    expect(page.locator("#throughput svg")).to_be_visible()
    expect(page.locator("#queues tr[data-queue='mail']")).to_contain_text("completed")
    # Live: the page's live part is fetched again without a reload.
    first = page.locator("#updated-at").inner_text()
    expect(page.locator("#updated-at")).not_to_have_text(first, timeout=10_000)
    site.shot(page, "overview")

    page.goto(site.base + "/jobs")
    expect(page.locator(f"tr[data-job='{done[0]}']")).to_be_visible()
    site.shot(page, "jobs")

    page.goto(site.base + "/jobs?queue=mail&state=completed&q=u3%40example")
    expect(page.locator("#jobs tbody tr")).to_have_count(1)
    expect(page.locator("#scan-note")).to_contain_text("Searched")
    site.shot(page, "jobs-text-search")

    page.goto(site.base + f"/jobs/{failing}")
    expect(page.locator("#job-state")).to_contain_text("scheduled")
    expect(page.locator("#next-retry")).to_contain_text("attempt 2")
    expect(page.locator("#retry-plan tbody tr")).to_have_count(3)  # attempts 3, 4, 5
    expect(page.locator("#attempts")).to_contain_text("the warehouse is down")
    expect(page.locator("#attempts .traceback")).to_contain_text("ValueError")
    site.shot(page, "job-retrying")

    page.goto(site.base + f"/jobs/{dead}")
    expect(page.locator("#job-state")).to_contain_text("dead")
    expect(page.locator("#attempts")).to_contain_text("card declined for tour")
    site.shot(page, "job-dead")

    page.goto(site.base + "/dead")
    expect(page.locator(f"tr[data-job='{dead}']")).to_be_visible()
    site.shot(page, "dead-letters")

    # As a scheduler records an occurrence it fired (its jobs: none here).
    fired = datetime(2031, 3, 14, 1, 30, tzinfo=UTC)
    app.driver.schedule_state(["nightly"])
    assert app.driver.schedule_fire(Fire("nightly", fired)) is not None
    page.goto(site.base + "/cron")
    task = page.locator("section[data-task='nightly']")
    expect(task).to_contain_text("Last fired2031-03-14 01:30:00Z")
    expect(task).to_contain_text("30 2 * * *")
    expect(task).to_contain_text("Europe/Paris")
    expect(task).to_contain_text("run-once")
    expect(task.locator(".next-runs tbody tr")).to_have_count(5)
    site.shot(page, "cron")

    page.goto(site.base + "/queues")
    expect(page.locator("#queues tr[data-queue='billing']")).to_be_visible()
    site.shot(page, "queues")

    page.goto(site.base + "/workers")
    site.shot(page, "workers")


def test_retry_a_dead_job_by_clicking_and_see_it_complete(site: Site, page: Any) -> None:
    dead = _dead_charge(site, "ada")
    page.goto(site.base + "/dead?queue=billing")
    row = page.locator(f"tr[data-job='{dead}']")
    expect(row).to_contain_text("card declined for ada")
    row.locator("button.btn-retry").click()
    # A confirmation first: nothing has changed yet.
    expect(page.locator("#confirm-what")).to_contain_text("Retry 1 job(s)?")
    assert _state(site, dead) is JobState.DEAD
    site.shot(page, "confirm-retry")
    page.locator("#confirm").click()
    expect(page.locator("#notice")).to_contain_text("retry: 1 of 1")
    page.goto(site.base + f"/jobs/{dead}")
    # The worker runs it (attempt 2 succeeds); the page shows it without a reload.
    expect(page.locator("#job-state")).to_have_text(re.compile("completed"), timeout=30_000)
    expect(page.locator("#job-attempt")).to_contain_text("2 of 2")
    site.shot(page, "job-retried-completed")


def test_retry_all_that_match_after_a_confirmation(site: Site, page: Any) -> None:
    ids = [_dead_charge(site, f"bulk{i}", tenant="bulk") for i in range(3)]
    page.goto(site.base + "/dead?queue=billing&tenant=bulk")
    expect(page.locator("#jobs tbody tr")).to_have_count(3)
    page.locator("#discard-all").click()
    expect(page.locator("#confirm-what")).to_contain_text("Discard 3 job(s) that match")
    site.shot(page, "confirm-discard-all")
    page.locator("#cancel").click()  # changing one's mind changes nothing
    assert all(_state(site, i) is JobState.DEAD for i in ids)
    page.locator("#retry-all").click()
    page.locator("#confirm").click()
    expect(page.locator("#notice")).to_contain_text("retry: 3 of 3")
    wait_until(lambda: all(_state(site, i) is JobState.COMPLETED for i in ids), 30, "the retries")


def test_pause_and_resume_a_queue(site: Site, page: Any, browser_context: Any) -> None:
    page.goto(site.base + "/queues")
    row = page.locator("#queues tr[data-queue='mail']")
    row.locator("button").click()
    expect(page.locator("#notice")).to_contain_text("paused mail")
    expect(row.locator(".paused-cell")).to_have_text("paused")
    assert any(q.name == "mail" and q.paused for q in site.app.queues())
    site.shot(page, "queues-paused")
    waiting = site.app.enqueue(dashjobs.send_mail, {"to": "paused@example.com"}).id
    time.sleep(1.0)  # the worker polls every 100 ms: a paused queue must hold the job
    assert _state(site, waiting) is JobState.AVAILABLE

    watcher = browser_context.new_page()
    try:
        watcher.goto(site.base + f"/jobs/{waiting}")
        expect(watcher.locator("#job-state")).to_contain_text("available")
        row.locator("button").click()  # Resume
        expect(page.locator("#notice")).to_contain_text("resumed mail")
        expect(row.locator(".paused-cell")).to_have_text("running")
        # The other tab was not reloaded: its live part shows the job completed.
        expect(watcher.locator("#job-state")).to_have_text(re.compile("completed"), timeout=30_000)
    finally:
        watcher.close()


def test_script_in_a_queue_name_and_an_input_renders_as_inert_text(site: Site, page: Any) -> None:
    # The library refuses such a queue name; another writer (a raw INSERT) is what can store
    # one, so the row goes in through the driver.
    foreign = NewJob(
        id=uuid7(),
        name="foreign.job",
        queue=XSS_QUEUE,
        input='{"html": "<b>bold</b>"}',
        idempotency_key=f"xss-{uuid7()}",
        max_attempts=1,
    )
    site.app.driver.job_insert_many([foreign])
    paused = site.app.enqueue(dashjobs.report, {"note": XSS_INPUT}, delay="1h").id

    for path in ("/", "/queues", f"/jobs?queue={XSS_QUEUE}"):
        page.goto(site.base + path)
        expect(page.get_by_text(XSS_QUEUE).first).to_be_visible()
        assert page.locator("script:not([src])").count() == 0
    site.shot(page, "xss-jobs")
    page.goto(site.base + f"/jobs/{paused}")
    expect(page.locator("#job-input")).to_contain_text(XSS_INPUT)
    assert page.locator("#job-input img").count() == 0
    html = page.content()
    assert "&lt;script&gt;alert('input')&lt;/script&gt;" in html
    site.shot(page, "xss-job")
    # The page fixture fails the test if a dialog opened or the CSP reported a violation.


def test_a_post_without_a_csrf_token_is_refused(site: Site, page: Any) -> None:
    page.goto(site.base + "/queues")
    row = page.locator("#queues tr[data-queue='billing']")
    # A real form submission from the page, with its token taken out.
    page.evaluate("document.querySelectorAll('input[name=csrf]').forEach(e => e.remove())")
    row.locator("button").click()
    expect(page.locator("body")).to_contain_text("refused: the form's CSRF token is missing")
    site.shot(page, "csrf-refused")
    assert not any(q.name == "billing" and q.paused for q in site.app.queues())
    # A forged token (the cookie is sent, the field does not match it) is refused as well.
    response = page.request.post(
        site.base + "/actions/queues",
        form={"queue": "billing", "action": "pause", "csrf": "forged"},
    )
    assert response.status == 403
    assert not any(q.name == "billing" and q.paused for q in site.app.queues())


def test_a_read_only_mount_has_no_buttons_that_change_state(site: Site, page: Any) -> None:
    dead = _dead_charge(site, "readonly")
    pages = ["/", "/jobs", "/dead", f"/jobs/{dead}", "/queues", "/cron", "/workers"]
    for path in pages:
        page.goto(site.base + "/ro" + path)
        expect(page.locator("#read-only-badge")).to_be_visible()
        assert page.locator("form[method=post]").count() == 0, path
        # Any button left submits a GET form (the jobs filter).
        changing = page.locator("button").evaluate_all(
            "bs => bs.filter(b => !(b.form && b.form.method === 'get')).length"
        )
        assert changing == 0, path
    site.shot(page, "read-only-job")
    page.goto(site.base + "/ro/dead")
    expect(page.locator(f"tr[data-job='{dead}']")).to_be_visible()
    site.shot(page, "read-only-dead-letters")
    response = page.request.post(site.base + "/ro/actions/jobs", form={"action": "retry"})
    assert response.status == 405
    assert _state(site, dead) is JobState.DEAD


def test_another_tenants_job_answers_404(site: Site, page: Any) -> None:
    ours = site.app.enqueue(dashjobs.send_mail, {"to": "acme"}, tenant_id="acme").id
    theirs = site.app.enqueue(dashjobs.send_mail, {"to": "globex"}, tenant_id="globex").id
    page.goto(site.base + "/t/acme/jobs")
    expect(page.locator(f"tr[data-job='{ours}']")).to_be_visible()
    assert page.locator(f"tr[data-job='{theirs}']").count() == 0
    expect(page.locator("#tenant-badge")).to_have_text("tenant acme")
    site.shot(page, "tenant-jobs")
    response = page.goto(site.base + f"/t/acme/jobs/{theirs}")
    assert response is not None and response.status == 404
    expect(page.locator("#error-cause")).to_contain_text("Nothing here for this tenant")
    site.shot(page, "tenant-404")
    # The filter cannot reach past the scope either.
    page.goto(site.base + "/t/acme/jobs?tenant=globex")
    assert page.locator(f"tr[data-job='{theirs}']").count() == 0
    response = page.goto(site.base + f"/t/acme/jobs/{ours}")
    assert response is not None and response.status == 200
    page.goto(site.base + "/t/acme/")
    site.shot(page, "tenant-overview")


def test_the_workers_page_shows_the_live_worker_and_what_it_runs(site: Site, page: Any) -> None:
    running = site.app.enqueue(dashjobs.nap, {"seconds": 20}).id
    wait_until(lambda: _state(site, running) is JobState.RUNNING, 30, f"{running} to start")
    page.goto(site.base + "/workers")
    row = page.locator(f"#workers tr[data-worker*=':{site.worker.pid}:']")
    expect(row).to_contain_text(socket.gethostname())
    expect(row).to_contain_text(str(site.worker.pid))
    expect(row).to_contain_text("slow")
    expect(row.locator(f"a[href$='/jobs/{running}']")).to_be_visible()
    site.shot(page, "workers-live")
    page.goto(site.base + f"/jobs/{running}")
    expect(page.locator("#job-worker")).to_contain_text(f"pid {site.worker.pid}")
    site.shot(page, "job-running")
    page.goto(site.base + "/")
    expect(page.locator("#live-workers")).to_contain_text(str(site.worker.pid))
    site.shot(page, "overview-live-workers")
    site.app.cancel_job(running)

"""Django on a fresh SQLite file: the first enqueue inside ``atomic()`` (Django's ``BEGIN`` is
deferred: it holds no lock until the first statement) creates the job tables on the App's
own connection and joins the transaction; it is not refused as if ``atomic()`` held the write
lock. Run before anything else has touched the file, as in a project's first request."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("django")
from django.db import connections, transaction

from ultimat3.jobs import App
from ultimat3.jobs.integrations.django import using

from .conftest import JOBS, record
from .djangoproject import point_at

ALIAS = "fresh_sqlite"


@pytest.fixture
def fresh(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[App]:
    url = point_at(ALIAS, request, tmp_path / "fresh.sqlite3")
    sys.modules[JOBS.__name__] = JOBS
    app = App(url, modules=[JOBS])  # never opened: the file does not exist yet
    yield app
    connections[ALIAS].close()
    app.close()
    sys.modules.pop(JOBS.__name__, None)


def test_the_first_enqueue_in_atomic_sets_up_a_fresh_file_and_joins(fresh: App) -> None:
    with transaction.atomic(using=ALIAS), using(fresh, ALIAS):
        record.enqueue({"order": 1})
        with connections[ALIAS].cursor() as cursor:
            cursor.execute("CREATE TABLE orders (id integer)")
            cursor.execute("INSERT INTO orders VALUES (1)")
    assert fresh.count_jobs() == 1
    with pytest.raises(RuntimeError), transaction.atomic(using=ALIAS), using(fresh, ALIAS):
        record.enqueue({"order": 2})
        raise RuntimeError("the request fails")
    assert fresh.count_jobs() == 1

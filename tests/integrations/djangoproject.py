"""The Django project of the integration tests: settings are process-wide, so they are
configured once, when the first Django test module imports this one.

Aliases: ``default`` (pointed at a fresh SQLite file by each test of ``test_django.py``),
``fresh_sqlite`` / ``fresh_postgres`` (a fresh database per test), and the conformance suite's
``conform_sqlite`` / ``conform_postgres`` (``test_django_conformance.py``). Each has a
``JobsBackend`` of the same name; ``retrying_sqlite`` / ``retrying_postgres`` are backends on
the conformance databases with ``MAX_ATTEMPTS`` 3.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path

import django
import pytest
from django.conf import settings
from django.db import connections

_BACKEND = "ultimat3.jobs.integrations.django.JobsBackend"

if not settings.configured:
    _scratch = tempfile.mkdtemp(prefix="u3j-django-")
    atexit.register(shutil.rmtree, _scratch, True)
    settings.configure(
        DATABASES={
            "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{_scratch}/boot.db"},
            # Pointed at a fresh database by each test that uses them.
            "fresh_sqlite": {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{_scratch}/f.db"},
            "fresh_postgres": {"ENGINE": "django.db.backends.postgresql", "NAME": "unset"},
            "conform_sqlite": {
                "ENGINE": "django.db.backends.sqlite3",
                "NAME": f"{_scratch}/c.db",
            },
            "conform_postgres": {"ENGINE": "django.db.backends.postgresql", "NAME": "unset"},
            # Not the job database of any App: enqueues in its atomic() cannot join.
            "elsewhere": {"ENGINE": "django.db.backends.sqlite3", "NAME": f"{_scratch}/e.db"},
        },
        INSTALLED_APPS=[],
        USE_TZ=True,
        TASKS={
            "default": {
                "BACKEND": _BACKEND,
                "QUEUES": ["default", "emails"],
                "OPTIONS": {"APP": "u3j_django_app:app"},
            },
            **{
                f"fresh_{kind}": {
                    "BACKEND": _BACKEND,
                    "QUEUES": ["default"],
                    "OPTIONS": {"APP": "u3j_django_fresh:app", "DATABASE": f"fresh_{kind}"},
                }
                for kind in ("sqlite", "postgres")
            },
            **{
                f"conform_{kind}": {
                    "BACKEND": _BACKEND,
                    "QUEUES": ["default", "queue-1"],
                    "OPTIONS": {"APP": "u3j_django_conform:app", "DATABASE": f"conform_{kind}"},
                }
                for kind in ("sqlite", "postgres")
            },
            **{
                f"retrying_{kind}": {
                    "BACKEND": _BACKEND,
                    "OPTIONS": {
                        "APP": "u3j_django_conform:app",
                        "DATABASE": f"conform_{kind}",
                        "MAX_ATTEMPTS": 3,
                    },
                }
                for kind in ("sqlite", "postgres")
            },
            "elsewhere": {
                "BACKEND": _BACKEND,
                "OPTIONS": {"APP": "u3j_django_conform:app", "DATABASE": "elsewhere"},
            },
        },
    )
    django.setup()


def point_at(alias: str, request: pytest.FixtureRequest, sqlite_file: Path) -> str:
    """Point the Django alias (``..._sqlite`` or ``..._postgres``) at a fresh database: the
    SQLite file, or the test server's fresh PostgreSQL database (``pg_dsn``); return the URL
    an App opens it with."""
    target = connections[alias]
    target.close()
    if alias.endswith("_sqlite"):
        target.settings_dict["NAME"] = str(sqlite_file)
        return f"sqlite:///{sqlite_file}"
    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(request.getfixturevalue("pg_dsn"))
    target.settings_dict.update(
        NAME=parts["dbname"], USER=parts["user"], HOST=parts["host"], PORT=parts["port"]
    )
    return f"postgresql://{parts['user']}@{parts['host']}:{parts['port']}/{parts['dbname']}"

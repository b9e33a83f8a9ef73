"""The job tables, created (and brought up to date) by the library's own migrations: one
step, outside a transaction, since it writes through a connection of the library's. A release
whose job schema changes adds a migration here that runs the same step again."""

from __future__ import annotations

from django.db import migrations  # type: ignore[import-untyped]

from ultimat3.jobs.integrations.django import _migrate_job_tables


class Migration(migrations.Migration):  # type: ignore[misc]  # Django's classes are untyped
    atomic = False
    initial = True
    dependencies: list[tuple[str, str]] = []  # noqa: RUF012  (Django's convention)
    operations = [  # noqa: RUF012
        migrations.RunPython(_migrate_job_tables, migrations.RunPython.noop, elidable=False)
    ]

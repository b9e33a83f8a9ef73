"""The Django application of ``ultimat3.jobs.integrations.django``: add it to
``INSTALLED_APPS`` and ``manage.py migrate`` creates the job tables (its migrations run the
library's own, on each database alias a ``JobsBackend`` names)."""

from __future__ import annotations

from django.apps import AppConfig  # type: ignore[import-untyped]


class JobsConfig(AppConfig):  # type: ignore[misc]  # Django's classes are untyped
    name = "ultimat3.jobs.integrations.django"
    label = "ultimat3_jobs"
    verbose_name = "ultimat3-jobs"

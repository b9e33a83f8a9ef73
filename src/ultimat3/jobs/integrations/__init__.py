"""Framework integrations: each makes enqueues join the caller's own transaction.

- ``ultimat3.jobs.integrations.sqlalchemy``: SQLAlchemy 2 ``Session``/``Connection`` and
  ``AsyncSession``/``AsyncConnection`` (the insert goes through the session's connection,
  savepoints included); ``install(app, sessions)`` joins every session transaction at once.
- ``ultimat3.jobs.integrations.psycopg``: psycopg 3 ``AsyncConnection`` (a sync
  ``Connection`` needs nothing: ``with app.using(conn):``).
- ``ultimat3.jobs.integrations.django``: Django's connection inside ``atomic()``, a
  ``django.tasks`` backend, and a Django application whose migration creates the job tables.

Each module imports its framework itself, only when imported: ``import ultimat3.jobs`` pulls
in none of them.
"""

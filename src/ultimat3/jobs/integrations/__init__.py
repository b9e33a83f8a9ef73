"""Framework integrations: each makes enqueues join the caller's own transaction.

- ``ultimat3.jobs.integrations.sqlalchemy``: SQLAlchemy 2 ``Session``/``Connection`` and
  ``AsyncSession``/``AsyncConnection`` (the insert goes through the session's connection,
  savepoints included).
- ``ultimat3.jobs.integrations.psycopg``: psycopg 3 ``AsyncConnection`` (a sync
  ``Connection`` needs nothing: ``with app.using(conn):``).
- ``ultimat3.jobs.integrations.django``: Django's connection inside ``atomic()``, and a
  ``django.tasks`` backend.

Each module imports its framework itself, only when imported: ``import ultimat3.jobs`` pulls
in none of them.
"""

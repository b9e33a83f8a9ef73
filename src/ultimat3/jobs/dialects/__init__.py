"""What the SQLite (and PostgreSQL) job drivers and outbox stores share: time encoding,
database identity, joining a caller's connection, migrations, URLs and error plumbing.

One module per dialect; the drivers (``ultimat3.jobs.drivers``) and the outbox stores
(``ultimat3.jobs.outboxes``) both import it, so a rule about a caller's connection (how a
legacy-mode ``sqlite3`` connection gets its ``BEGIN``, when a psycopg transaction can be joined)
is written once.
"""

"""What the SQLite (and PostgreSQL) job drivers and outbox stores share: time encoding,
database identity, joining a caller's connection, migrations, URLs and error plumbing.

One module per dialect; the drivers (``ultimat3.jobs.drivers``) and the outbox stores
(``ultimat3.jobs.outboxes``) both import it, so a rule about a caller's connection (how a
legacy-mode ``sqlite3`` connection gets its ``BEGIN``, when a psycopg transaction can be joined)
is written once.
"""

from __future__ import annotations

from ultimat3.jobs.errors import ConfigurationError

#: SQLAlchemy's ``dialect+driver`` schemes an app already has in its settings, and the scheme
#: of ours each names: the URL says where the database is; which client library talks to it
#: is ours to choose (psycopg 3, the standard library's sqlite3).
SQLALCHEMY_SCHEMES = {
    "postgresql+psycopg": "postgresql",
    "postgresql+psycopg_async": "postgresql",
    "postgresql+psycopg2": "postgresql",
    "sqlite+pysqlite": "sqlite",
    "sqlite+aiosqlite": "sqlite",
}


def canonical_url(url: str) -> str:
    """``url`` with a SQLAlchemy ``dialect+driver`` scheme (``postgresql+psycopg://``,
    ``sqlite+aiosqlite:///``, ...) written as the plain scheme it names, so one setting serves
    the app's SQLAlchemy engine and its jobs; any other URL unchanged. A ``+driver`` that is
    not one of these is refused rather than guessed at."""
    scheme, sep, rest = url.partition(":")
    if not sep or "+" not in scheme:
        return url
    plain = SQLALCHEMY_SCHEMES.get(scheme.lower())
    if plain is None:
        known = ", ".join(f"{s}://" for s in SQLALCHEMY_SCHEMES)
        raise ConfigurationError(
            f"the URL scheme {scheme}:// names a client library this package does not use",
            fix=f"write postgresql://, sqlite:/// or memory://; SQLAlchemy's {known} are "
            "understood too",
        )
    return plain + sep + rest

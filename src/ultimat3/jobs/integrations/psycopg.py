"""psycopg 3 ``AsyncConnection``: ``await app.enqueue_async(...)`` inside your async transaction.

A sync ``psycopg.Connection`` needs nothing from here: ``with app.using(conn):`` joins it (the
job driver when it is the job database, the outbox store when it is ``App(outbox=...)``'s).

An ``AsyncConnection`` cannot be handed to the sync core as it is, and it must not be used from
another thread while its event loop uses it. ``using(app, aconn)`` therefore binds a *sync view*
of the same server session (``sync_view``): a ``psycopg.Connection`` over the same libpq
connection, whose lock is the ``AsyncConnection``'s own ``asyncio.Lock``, taken through the
event loop. ``enqueue_async`` runs the sync core on a worker thread (the binding travels with
the context); every statement that thread sends holds that lock, so it never interleaves with
a statement of another task on the connection, and it runs in your open transaction: it is
the same session. Concurrent ``enqueue_async`` calls in one block (``asyncio.gather``) run one
after the other, each whole (its savepoint included), so nothing can interleave. A plain ``app.enqueue(...)`` on the event loop's thread works too (it blocks
the loop for the insert, as any sync call does) while no other task holds the connection.

Guarantee: the job rows (or ``x_outbox`` rows) are written inside your transaction and exist
if and only if you commit; a failed insert rolls back to its savepoint and raises, and your
transaction goes on (the rule of ARCHITECTURE.md, "The life of a job").

Limits: the view is valid for the ``async with`` block only; it shares the connection's
session but not its Python-side settings (adapters, row factory, prepared statements: the view
prepares nothing). ``autocommit`` is read when the block starts.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg

from ultimat3.jobs.errors import ConfigurationError

if TYPE_CHECKING:
    from ultimat3.jobs.app import App

__all__ = ["sync_view", "using"]


class _LoopLock:
    """A ``threading.Lock`` look-alike that holds the ``AsyncConnection``'s ``asyncio.Lock``,
    taken and released on its event loop."""

    def __init__(self, lock: asyncio.Lock, loop: asyncio.AbstractEventLoop) -> None:
        self._lock = lock
        self._loop = loop
        self._held = False

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return False

    def __enter__(self) -> _LoopLock:
        if self._on_loop_thread():
            # The loop is blocked in this call, so no other task can take the lock meanwhile;
            # if one holds it now, it is suspended mid-statement and waiting would deadlock.
            if self._lock.locked():
                raise ConfigurationError(
                    "an enqueue on the event loop's thread found the async connection busy "
                    "with another task",
                    fix="use `await app.enqueue_async(...)` inside `ultimat3.jobs."
                    "integrations.psycopg.using(app, conn)`",
                )
            self._held = False
            return self
        asyncio.run_coroutine_threadsafe(self._lock.acquire(), self._loop).result()
        self._held = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._held:
            self._held = False
            self._loop.call_soon_threadsafe(self._lock.release)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        self.__enter__()
        return True

    def release(self) -> None:
        self.__exit__(None, None, None)


class _SyncView(psycopg.Connection[Any]):
    """A sync ``Connection`` over an ``AsyncConnection``'s libpq session; see the module."""

    def __init__(self, aconn: psycopg.AsyncConnection[Any], loop: asyncio.AbstractEventLoop):
        pgconn = aconn.pgconn
        # The base class re-points libpq's notice and notify callbacks at the new object;
        # they stay with the connection that owns the session.
        notice, notify = pgconn.notice_handler, pgconn.notify_handler
        super().__init__(pgconn)
        pgconn.notice_handler, pgconn.notify_handler = notice, notify
        self.lock = _LoopLock(aconn.lock, loop)  # type: ignore[assignment]  # same protocol
        self._autocommit = aconn.autocommit
        # Prepared statement names are numbered per Python object: ours could collide with
        # the async connection's on the shared session.
        self.prepare_threshold = None
        # Owned by the async connection: closing or collecting the view must not end it, and
        # psycopg skips its "deleted while open" warning for pooled (owned) connections.
        self._pool = None

    def close(self) -> None:
        """Does nothing: the session belongs to the ``AsyncConnection``."""


def sync_view(
    aconn: psycopg.AsyncConnection[Any], loop: asyncio.AbstractEventLoop | None = None
) -> psycopg.Connection[Any]:
    """A sync ``psycopg.Connection`` on ``aconn``'s session, safe to use from worker threads
    while ``loop`` (default: the running loop) runs. See the module docstring."""
    if not isinstance(aconn, psycopg.AsyncConnection):
        raise ConfigurationError(
            f"sync_view needs a psycopg AsyncConnection, not {type(aconn).__name__}",
            fix="pass a sync psycopg Connection to app.using(conn) directly",
        )
    if aconn.closed:
        raise ConfigurationError("the connection is closed", fix="pass an open AsyncConnection")
    return _SyncView(aconn, loop or asyncio.get_running_loop())


@asynccontextmanager
async def using(app: App, conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[Any]:
    """``async with using(app, conn):`` makes ``await app.enqueue_async(...)`` (and
    ``handle.enqueue``) in the block part of ``conn``'s transaction; you commit ``conn`` as
    usual. The job database's driver joins it when ``conn`` is on the job database, the
    app's outbox store otherwise."""
    view = sync_view(conn)
    with app._using(view, asyncio.Lock()):
        yield conn

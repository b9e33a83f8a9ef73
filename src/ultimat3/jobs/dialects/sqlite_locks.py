"""Who holds a SQLite file's write lock, asked of the operating system, and what a wait for it
can tell: shared by the job driver and the outbox store (``dialects.sqlite`` is the rest).

- A database is identified by its file's device and inode (``file_identity``), so two paths
  to one file (a symlink, ``./jobs.db`` and ``/srv/app/jobs.db``) are one database.
- Who holds the write lock is read from Linux's ``/proc/locks`` (``write_lock_holders``), and
  which connections of this process are the library's own is kept in a registry
  (``hold_own``), so a write blocked by the application's own connection in this process is
  told apart from one blocked by another process (``blocked_here``, ``HolderWatch``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import sys
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

from ultimat3.jobs.driver import DatabaseId


def file_identity(path: str) -> DatabaseId:
    """The identity of the database file at ``path`` (device and inode once it exists)."""
    try:
        st = os.stat(path)
    except OSError:
        return DatabaseId("sqlite", ("path", os.path.realpath(path)), path)
    return DatabaseId("sqlite", (st.st_dev, st.st_ino), path)


# The locks of SQLite's unix VFS, POSIX record locks (fcntl) on bytes of the files: in WAL mode
# the write lock is byte 120 of the -shm file (the first of its lock bytes, WAL_WRITE_LOCK);
# in rollback-journal mode a writer holds the RESERVED byte of the database, then PENDING and
# the SHARED range to commit, and readers hold the SHARED range.
_SHM_WRITE_BYTE = 120
_PENDING_BYTE = 0x40000000
_SHARED_END = _PENDING_BYTE + 2 + 510 - 1
_PROC_LOCKS = "/proc/locks"


def write_lock_holders(path: str) -> frozenset[int] | None:
    """The ids of the processes whose locks on the SQLite database at ``path`` keep another
    connection from writing: the write lock in WAL mode; in rollback-journal mode any lock a
    writer or a reader holds. Read from Linux's ``/proc/locks`` (the owner of each POSIX
    lock); None where there is no such list (another system). A holder in another PID
    namespace is not listed: an empty set proves nothing."""
    try:
        with open(_PROC_LOCKS, encoding="ascii", errors="replace") as listing:
            text = listing.read()
    except OSError:
        return None
    files: dict[int, tuple[str, str | None]] = {}  # inode -> (which file, its device or None)
    for name, kind in ((path, "db"), (path + "-shm", "shm")):
        try:
            st = os.stat(name)
        except OSError:
            continue
        major, minor = os.major(st.st_dev), os.minor(st.st_dev)
        # An anonymous device (major 0: overlayfs, a FUSE or network mount) may list its locks
        # under the device of the file below it: match those by inode alone.
        files[st.st_ino] = (kind, f"{major:02x}:{minor:02x}" if major else None)
    found: list[tuple[str, str, int, int, int]] = []  # (file, READ/WRITE, pid, start, end)
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8 or fields[1] != "POSIX":  # "->" marks a waiter, not a holder
            continue
        device, _, inode = fields[5].rpartition(":")
        if not inode.isdigit() or int(inode) not in files:
            continue
        kind, want = files[int(inode)]
        if want is not None and device != want:
            continue
        try:
            pid, start = int(fields[4]), int(fields[6])
            end = _SHARED_END if fields[7] == "EOF" else int(fields[7])
        except ValueError:
            continue
        found.append((kind, fields[3], pid, start, end))
    if any(kind == "shm" for kind, *_ in found):  # WAL: every open connection locks the -shm
        return frozenset(
            pid
            for kind, mode, pid, start, end in found
            if kind == "shm" and mode == "WRITE" and start <= _SHM_WRITE_BYTE <= end
        )
    return frozenset(
        pid
        for kind, _, pid, start, end in found
        if kind == "db" and start <= _SHARED_END and end >= _PENDING_BYTE
    )


#: The connections the library opened on SQLite files, in this process: id -> (connection,
#: the file's identity key, the process that opened it, the finalizer that disowns it when its
#: owner is collected: detached by ``disown``, so it holds the connection no longer).
_Own = tuple[
    sqlite3.Connection, tuple[object, ...], int, "weakref.finalize[[sqlite3.Connection], object]"
]
_own: dict[int, _Own] = {}
#: Reentrant: a driver's connection is disowned by a finalizer, which the garbage collector may
#: run on a thread that holds it already.
_own_lock = threading.RLock()


def hold_own(conn: sqlite3.Connection, path: str, owner: object) -> None:
    """Note ``conn`` as one of the library's connections to the file at ``path``, so that
    ``blocked_here`` can tell them from the application's, until ``disown`` or until
    ``owner`` (the object that keeps ``conn``: a store, a thread's slot) is collected, closed
    or not (a ``sqlite3.Connection`` takes no weak reference, so the registry's is strong)."""
    pid = os.getpid()
    key = file_identity(path).key
    with _own_lock:
        for known in [known for known, entry in _own.items() if entry[2] != pid]:
            del _own[known]  # a forked child's copy of its parent's: never used here
        disown(conn)  # noted again: its old finalizer goes
        _own[id(conn)] = (conn, key, pid, weakref.finalize(owner, disown, conn))


def disown(conn: sqlite3.Connection) -> None:
    """Forget ``conn`` (closed, or about to be): its finalizer is detached, so neither the
    registry nor the finalizer keeps it or its owner's bookkeeping any longer."""
    with _own_lock:
        entry = _own.get(id(conn))
        if entry is not None and entry[0] is conn:
            del _own[id(conn)]
            entry[3].detach()


def blocked_here(path: str) -> bool:
    """True when the write lock on ``path`` is held by this very process, on a connection that
    is not one of the library's (none of those is inside a transaction on the file): the
    application's own, such as a SQLAlchemy session after ``flush()`` or a ``sqlite3``
    connection in a transaction. A write of ours could only wait for it, and for ever when it
    is on the waiting thread. False when another process holds it, or when this cannot be
    known (``write_lock_holders`` is None)."""
    holders = write_lock_holders(path)
    if not holders or os.getpid() not in holders:
        return False
    key, pid = file_identity(path).key, os.getpid()
    with _own_lock:
        entries = tuple(_own.values())
    for conn, file, opener, _ in entries:
        if file != key or opener != pid:
            continue
        try:
            if conn.in_transaction:
                return False
        except sqlite3.ProgrammingError:  # closed meanwhile
            continue
    return True


_log = logging.getLogger("ultimat3.jobs.dialects.sqlite")


def only_thread() -> bool:
    """True when the calling thread is the only thread of this process that runs Python: a
    connection of this process can then be released by no one while it waits."""
    return len(sys._current_frames()) == 1


@dataclass(frozen=True, slots=True)
class LockWatch:
    """How a wait for the write lock looks at who holds it (``HolderWatch``): after ``look``
    seconds, then as often. Held ``held_for`` by a connection of this process that is not the
    library's (``blocked_here``), it is the application's own: the wait ends there only when
    no other thread of this process could release it (``alone()``: the waiting thread is the
    only one), else it is noted once and goes on."""

    look: float = 0.05
    held_for: float = 0.5
    alone: Callable[[], bool] = only_thread


class HolderWatch:
    """An ``on_busy`` for ``retry_busy`` that looks at who holds the write lock on ``path``
    while a write waits for it, and tells a wait that cannot end from one that can.

    Held by the application's own connection in this process (``blocked_here``) for
    ``held_for``, with no other thread that could release it (or inside the caller's own
    transaction, ``in_callers_tx``), the wait raises ``held_here()``; with other threads
    running it goes on with one WARNING, and ``verdict()`` gives ``held_here()`` at the
    timeout instead of "busy"."""

    def __init__(
        self,
        path: str,
        held_here: Callable[[], Exception],
        *,
        in_callers_tx: bool = False,
        settings: LockWatch = LockWatch(),
    ) -> None:
        self.path = path
        self.settings = settings
        self.held_here = held_here
        #: The waiting call runs inside a transaction the caller opened on a connection of
        #: its own (``app.using(conn)``): that connection, this thread's, is the one that can
        #: hold the lock, so other threads running do not make the wait worth going on.
        self.in_callers_tx = in_callers_tx
        self._since: float | None = None
        self._look_at = settings.look
        self._throughout: bool | None = None  # None: not looked yet
        self._warned = False

    def __call__(self, waited: float) -> None:
        if waited < self._look_at:
            return
        self._look_at = waited + self.settings.look
        if not blocked_here(self.path):
            self._since = None
            self._throughout = False
            return
        if self._throughout is None:
            self._throughout = True
        if self._since is None:
            self._since = waited
        elif waited - self._since >= self.settings.held_for:
            if self.in_callers_tx or self.settings.alone():
                raise self.held_here() from None
            if not self._warned:
                self._warned = True
                error = self.held_here()
                _log.warning(
                    "jobs.sqlite.held-here: waiting %.1fs so far for the write lock on %s, "
                    "which this process holds on a connection that is not the library's; "
                    "waiting on in case another thread holds it. %s",
                    waited,
                    self.path,
                    error,
                    extra={"event": "jobs.sqlite.held-here", "path": self.path},
                )

    def verdict(self) -> Exception | None:
        """After the wait timed out: ``held_here()`` when this process held the lock on a
        connection not the library's at every look, and still does; else None."""
        if self._throughout and blocked_here(self.path):
            return self.held_here()
        return None

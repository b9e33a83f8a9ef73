"""Waiting for something to happen elsewhere without polling for it.

- ``Wake`` is a ``threading.Event`` that a ``select()`` can wait on too (``fileno()``): a
  waiter blocked on a database's file descriptor (a LISTEN socket, a file watch) returns the
  moment another thread sets it, instead of checking the event between slices of a poll.
- ``FileWatch`` tells when named files in one directory are written, in any process on this
  host: Linux inotify, through ``ctypes`` (the standard library has no binding). A SQLite
  commit appends to the ``-wal`` file, so a worker waiting for jobs sleeps in the kernel until
  one arrives, however long it is idle. ``FileWatch.open`` returns None where inotify is not
  available (not Linux, or the watch limit is reached); callers then poll, as they say.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import select
import struct
import sys
import threading
import weakref
from collections.abc import Collection

__all__ = ["FileWatch", "Wake"]


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class Wake(threading.Event):
    """An event whose ``set()`` also makes ``fileno()`` readable, until ``clear()``."""

    def __init__(self) -> None:
        super().__init__()
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._fd_lock = threading.Lock()
        weakref.finalize(self, _close_fds, self._read, self._write)

    def fileno(self) -> int:
        return self._read

    def set(self) -> None:
        with self._fd_lock:
            if not self.is_set():
                super().set()
                try:
                    os.write(self._write, b"w")
                except BlockingIOError:  # pragma: no cover - one byte per set: never full
                    pass

    def clear(self) -> None:
        with self._fd_lock:
            super().clear()
            try:
                while os.read(self._read, 64):
                    pass
            except BlockingIOError:
                pass


_IN_MODIFY = 0x00000002
_EVENT = struct.Struct("iIII")


@functools.cache
def _inotify() -> ctypes.CDLL | None:
    """libc with its inotify calls typed, loaded once; None where there is none (not Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    except (OSError, AttributeError):
        return None
    return libc


class FileWatch:
    """Writes to the files ``names`` of ``directory``, seen through one inotify descriptor."""

    __slots__ = ("__weakref__", "_fd", "_names")

    def __init__(self, fd: int, names: Collection[str]) -> None:
        self._fd = fd
        self._names = frozenset(os.fsencode(name) for name in names)
        weakref.finalize(self, _close_fds, fd)

    @classmethod
    def open(cls, directory: str, names: Collection[str]) -> FileWatch | None:
        """A watch, or None where inotify cannot give one (not Linux, or out of watches)."""
        libc = _inotify()
        if libc is None:
            return None
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_MODIFY) < 0:
            _close_fds(fd)
            return None
        return cls(fd, names)

    def fileno(self) -> int:
        return self._fd

    def drain(self) -> bool:
        """Read what is queued without blocking; True when a watched file was written."""
        seen = False
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return seen
            offset = 0
            while offset < len(data):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset : offset + length].rstrip(b"\0")
                offset += length
                if name in self._names:
                    seen = True

    def wait(self, timeout: float, wake: Wake | None = None) -> bool:
        """Block up to ``timeout`` seconds; True when a watched file was written. False on a
        timeout, when ``wake`` is set, or when only other files of the directory were written
        (the caller checks its deadline and waits again)."""
        fds = [self._fd] if wake is None else [self._fd, wake.fileno()]
        ready, _, _ = select.select(fds, [], [], max(0.0, timeout))
        if not ready or (wake is not None and wake.is_set()):
            return False
        return self.drain()

"""Job ids: UUIDv7 text, time-ordered (so they index well) and hard to guess (so one tenant
cannot walk another's ids). ``uuid.uuid7`` arrives in the stdlib only with Python 3.14.

The timestamp is the host's wall clock (``clock.wall_ns``), not an app's ``Clock``: it decides
nothing (no due time, lease or window reads an id); it orders ids in the index, so it follows
real time. Ids of a process only increase, so one app's fake clock set ahead would carry every
later id of the process, of any app, ahead with it."""

from __future__ import annotations

import os
import threading

from ultimat3.jobs.clock import wall_ns

_lock = threading.Lock()
_last_ms = 0
_seq = 0
#: The first hex digit of the random half with its top two bits set to the variant, 0b10.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def _after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # a lock held by another thread at the fork stays held


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def uuid7() -> str:
    """A RFC 9562 version-7 UUID as text; monotonic within this process."""
    return uuid7_many(1)[0]


def uuid7_many(n: int) -> list[str]:
    """``n`` ids, increasing, after every id this process made before: each millisecond holds
    4,096 (a 12-bit sequence number), past which the next millisecond is borrowed. The random
    bits are read from the operating system for each call, so a forked child never repeats
    its parent's."""
    if n < 1:
        return []
    global _last_ms, _seq
    ms = wall_ns() // 1_000_000
    rand = os.urandom(8 * n).hex()
    runs = []  # (millisecond, first sequence number, how many ids)
    with _lock:
        if ms <= _last_ms:
            ms, seq = _last_ms, _seq + 1
        else:
            seq = 0
        left = n
        while left:
            if seq > 0xFFF:  # 4096 ids in one millisecond: borrow the next millisecond
                ms, seq = ms + 1, 0
            take = min(left, 0x1000 - seq)
            runs.append((ms, seq, take))
            seq += take
            left -= take
        _last_ms, _seq = ms, seq - 1
    ids = []
    at = 0
    for ms, first, count in runs:
        head = _head(ms)
        for seq in range(first, first + count):
            r = rand[at : at + 16]
            at += 16
            ids.append(f"{head}{seq:03x}-{_VARIANT[r[0]]}{r[1:4]}-{r[4:]}")
    return ids


def _head(ms: int) -> str:
    """The id's text up to its sequence number: 48 bits of milliseconds, the version digit."""
    stamp = f"{ms & 0xFFFF_FFFF_FFFF:012x}"
    return f"{stamp[:8]}-{stamp[8:]}-7"


def token() -> str:
    """A lease token: random, never reused."""
    return os.urandom(12).hex()

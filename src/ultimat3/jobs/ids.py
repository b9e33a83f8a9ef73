"""Job ids: UUIDv7 text, time-ordered (so they index well) and hard to guess (so one tenant
cannot walk another's ids). ``uuid.uuid7`` arrives in the stdlib only with Python 3.14."""

from __future__ import annotations

import os
import threading
import time

_lock = threading.Lock()
_last_ms = 0
_seq = 0
_pool = b""
_pos = 0


def uuid7() -> str:
    """A RFC 9562 version-7 UUID as text; monotonic within this process."""
    global _last_ms, _seq, _pool, _pos
    ms = time.time_ns() // 1_000_000
    with _lock:
        if _pos >= len(_pool):  # one getrandom() call per 512 ids
            _pool, _pos = os.urandom(4096), 0
        rand = int.from_bytes(_pool[_pos : _pos + 8], "big") & 0x3FFF_FFFF_FFFF_FFFF
        _pos += 8
        if ms <= _last_ms:
            ms = _last_ms
            _seq += 1
            if _seq > 0xFFF:  # 4096 ids in one millisecond: borrow the next millisecond
                ms += 1
                _seq = 0
        else:
            _seq = 0
        _last_ms = ms
        seq = _seq
    return _text(ms, seq, rand)


def uuid7_many(n: int) -> list[str]:
    """``n`` ids as ``uuid7()`` would give them one by one (increasing, after every id this
    process made before), with one lock and one ``getrandom()`` for the batch."""
    if n == 1:
        return [uuid7()]
    global _last_ms, _seq
    ms = time.time_ns() // 1_000_000
    rands = os.urandom(8 * n)
    with _lock:
        if ms <= _last_ms:
            ms, seq = _last_ms, _seq + 1
        else:
            seq = 0
        stamps = []
        for _ in range(n):
            if seq > 0xFFF:  # 4096 ids in one millisecond: borrow the next millisecond
                ms, seq = ms + 1, 0
            stamps.append((ms, seq))
            seq += 1
        _last_ms, _seq = stamps[-1] if stamps else (_last_ms, _seq)
    mask = 0x3FFF_FFFF_FFFF_FFFF
    return [
        _text(ms, seq, int.from_bytes(rands[8 * i : 8 * i + 8], "big") & mask)
        for i, (ms, seq) in enumerate(stamps)
    ]


def _text(ms: int, seq: int, rand: int) -> str:
    value = (ms & 0xFFFF_FFFF_FFFF) << 80 | 0x7 << 76 | seq << 64 | 0b10 << 62 | rand
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def token() -> str:
    """A lease token: random, never reused."""
    return os.urandom(12).hex()

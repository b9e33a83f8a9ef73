"""Job ids: UUIDv7 text, increasing within a process, one at a time or by the batch."""

from __future__ import annotations

import os
import time
import uuid
import warnings

from ultimat3.jobs.ids import uuid7, uuid7_many


def check(ids: list[str]) -> None:
    for text in ids:
        parsed = uuid.UUID(text)
        assert parsed.version == 7 and parsed.variant == uuid.RFC_4122
        assert str(parsed) == text
    assert ids == sorted(ids) and len(set(ids)) == len(ids)


def test_a_batch_is_increasing_and_follows_the_ids_before_and_after_it() -> None:
    before = uuid7()
    batch = uuid7_many(10_000)  # more than 4096 in a millisecond: borrows later milliseconds
    after = uuid7()
    check([before, *batch, after])


def test_batches_and_single_ids_interleave_in_order() -> None:
    ids: list[str] = []
    for n in (1, 2, 3, 500, 1, 4097):
        ids += uuid7_many(n)
        ids.append(uuid7())
    check(ids)


def test_an_empty_batch() -> None:
    before = uuid7()
    assert uuid7_many(0) == []
    check([before, uuid7()])


def test_the_timestamp_is_now_and_the_62_random_bits_all_vary() -> None:
    now_ms = time.time_ns() // 1_000_000
    batch = uuid7_many(2_000)
    for text in (uuid7(), batch[0]):
        assert abs(int(text.replace("-", "")[:12], 16) - now_ms) < 5_000
    values = [uuid.UUID(text).int for text in batch]
    varied = 0
    for bit in range(62):  # every random bit is 0 in some id and 1 in another
        ones = sum(value >> bit & 1 for value in values)
        varied += 0 < ones < len(values)
    assert varied == 62
    assert {text[19] for text in batch} == set("89ab")


def test_a_forked_child_draws_its_own_random_bits() -> None:
    """A pre-fork server (gunicorn) forks after the app made ids: without fresh random bytes in
    the child, two processes give one id twice in the same millisecond and the second job is
    deduped into the first."""
    uuid7()  # the parent's pool of random bytes is filled; the child inherits a copy
    read, write = os.pipe()
    with warnings.catch_warnings():  # Python 3.12 warns of fork() in a process with threads
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.write(write, uuid7().encode())
        finally:
            os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    parent = uuid7()
    assert len(child) == 36
    assert child[19:] != parent[19:]  # the random half (62 bits): equal only by one chance in 2**62

"""Waiting for jobs and for results on PostgreSQL: the one LISTEN (``listen.Listener``) on
a direct connection; polling behind a transaction-mode pooler (``pooler="transaction"``,
where nothing of ours may live in a session: no LISTEN, no prepared statement, no ``SET``)
or with ``listen=False``; and the check, once, that a NOTIFY reaches the LISTEN
(``_check_pooler``: PgBouncer in transaction mode accepts LISTEN and delivers nothing)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from ultimat3.jobs import events
from ultimat3.jobs.clock import Clock
from ultimat3.jobs.dialects.postgres import connect
from ultimat3.jobs.drivers.postgres.connections import Conn, Connections
from ultimat3.jobs.drivers.postgres.listen import CONNECTED, LOST
from ultimat3.jobs.errors import DriverUnavailableError
from ultimat3.jobs.records import NewJob, ids_of

with contextlib.suppress(ImportError):  # the driver names the extra to install
    import psycopg
    from psycopg import sql as pg_sql

#: Polling without LISTEN: the gap between two looks just after activity, and how often a
#: waiter checks ``wake`` and in-process inserts (the longest gap while idle is ``poll``).
_POLL_FAST = 0.02
_POLL_SLICE = 0.05


class Waiting(Connections):
    """``wait_for_jobs``, ``job_wait`` and what they need."""

    def wait_for_jobs(self, timeout: float, wake: threading.Event) -> None:
        """Return after a wake-up counted since this thread's last claim or wait (its first
        wait counts from its start), when ``wake`` is set, or after ``timeout``."""
        timeout = max(0.0, timeout)
        seen: int = getattr(self._counts, "seen", self._wake_seq)
        if self._listening():
            self._listener.consume(self._channel, self._heard_jobs)
            seen = self._listen_wait(timeout, wake, seen)
        else:
            seen = self._poll_wait(timeout, wake, seen)
        self._counts.seen, self._counting = seen, True

    def _listen_wait(self, timeout: float, wake: threading.Event, seen: int) -> int:
        """Turn the listener until the count moves past ``seen``; the count seen last."""
        deadline = self._clock.monotonic() + timeout
        while not wake.is_set() and not self._closed:
            remaining, now_seen = deadline - self._clock.monotonic(), self._wake_seq
            if now_seen != seen:
                return now_seen
            if remaining <= 0:
                break
            self._listener.turn(min(remaining, self._wait_slice), wake, changed=self._woken(seen))
        return seen

    def _listening(self) -> bool:
        """Whether to LISTEN, after the pooler check when it is due. Not until that check has
        run (the server was away): a LISTEN through a transaction pooler would stay behind on
        a server session that other clients get next."""
        if self._probe_pooler and not self._probed:
            self._check_pooler()
        return self._listen and not (self._probe_pooler and not self._probed)

    def _woken(self, seen: int) -> Callable[[], bool]:
        return lambda: self._wake_seq != seen

    def _heard_jobs(self, event: str, payload: str | None) -> None:
        """Under the listener's ``cond``: wake the waiters for a notification, a lost LISTEN
        connection, and a fresh one after a loss or once some thread counts from a claim or
        wait before it (jobs inserted while nobody listened: a worker's first wait comes
        after its first claim, and its next poll may be a minute away): every waiter claims
        once."""
        if event == LOST:
            self._listen_lost = True
        elif event == CONNECTED:
            lost, self._listen_lost = self._listen_lost, False
            if not (lost or self._counting):
                return
        self._wake_seq += 1

    def _poll_wait(self, timeout: float, wake: threading.Event, seen: int) -> int:
        """Without LISTEN: until an insert by this driver (``_signal``) or a new newest job id
        (``_look``, which signals) moves the count past ``seen``, or a look fails (the
        caller's next call meets the error); the count seen last."""
        deadline = self._clock.monotonic() + timeout
        while not wake.is_set() and not self._closed:
            now, now_seen = self._clock.monotonic(), self._wake_seq
            if now_seen != seen:
                return now_seen
            if now >= deadline:
                break
            if now >= self._look_at and self._look_lock.acquire(blocking=False):
                try:
                    if self._look(now):
                        return self._wake_seq
                finally:
                    self._look_lock.release()
            pause = min(deadline, max(self._look_at, now + 0.001)) - self._clock.monotonic()
            self._clock.sleep(max(0.0, min(pause, _POLL_SLICE)), wake)
        return seen

    def _look(self, now: float) -> bool:
        """One look at the newest job id; True (and every waiter signalled) when it changed.
        Looks come every 20 ms just after a change, then further apart the longer nothing
        changes (a twentieth of the quiet time), at most ``poll`` apart."""
        quiet = now - self._active_at
        self._look_at = now + min(self._poll, max(_POLL_FAST, quiet / 20))
        try:
            rows = self._fetch("job_newest", {})
        except DriverUnavailableError:
            self._look_at = now + self._poll
            return True  # the caller's next call meets the error (and backs off)
        newest = rows[0][0] if rows else None
        if self._looked and (
            newest is None or (self._newest is not None and newest <= self._newest)
        ):
            return False
        first = not self._looked
        self._looked = True
        self._newest = newest
        if first:
            return False  # the first look only learns where things stand
        self._active_at = now
        self._look_at = now + _POLL_FAST
        self._signal()
        return True

    def _check_pooler(self) -> None:
        """Once: does a NOTIFY reach our LISTEN? Behind a transaction-mode pooler it does not;
        then warn with the fix, and poll without prepared statements from now on. A NOTIFY
        merely late (a loaded machine) must not turn anything off: the server is asked first
        whether the connection is direct (``_direct``); only where it cannot tell does the
        check wait longer, for that NOTIFY or a second one."""
        if not self._probe_pooler or self._probed or self._clock.monotonic() < self._probe_retry_at:
            return
        self._probed = True
        name = f"{self._channel}:probe"
        payloads = {uuid.uuid4().hex}
        try:
            with connect(self._dsn, self._connect_kwargs) as probe:
                with self._watch.watching(probe):
                    probe.execute(pg_sql.SQL("LISTEN {}").format(pg_sql.Identifier(name)))
                self._notify_probe(name, next(iter(payloads)))
                got = _heard(probe, payloads, self._probe_wait, self._clock) or self._direct(probe)
                if not got:  # late, or never: wait longer for it, or for a second one
                    second = uuid.uuid4().hex
                    payloads.add(second)
                    self._notify_probe(name, second)
                    got = _heard(probe, payloads, self._probe_confirm, self._clock)
        except (psycopg.Error, DriverUnavailableError):
            # Cannot tell now; a later migrate or wait asks again (not sooner than in 5 s).
            self._probed = False
            self._probe_retry_at = self._clock.monotonic() + 5.0
            return
        if got:
            return
        # The probe's LISTEN may stay registered on a pooled server session (until the pooler
        # closes it); only these probes ever notify that channel.
        self._listen = False
        self._stateless = True
        self._prepare = False
        self._listener.drop()
        events.warning(
            "jobs.postgres.pooler",
            url=self.display_url,
            cause="a NOTIFY sent to this database never reached its LISTEN: a "
            "transaction-mode pooler (PgBouncer pool_mode=transaction, a managed service's "
            "transaction pooler) is in between; prepared statements would fail there too",
            fix="add ?pooler=transaction to the URL (or connect past the pooler); until "
            "then this driver polls and prepares no statement",
        )

    def _notify_probe(self, channel: str, payload: str) -> None:
        params = {"channel": channel, "payload": payload}
        self._fetch(self._q["notify_probe"], params, prepare=False)

    def _direct(self, probe: Conn) -> bool:
        """Whether the server's session of ``probe`` sees both ends of its socket as we do
        (``session_ends``): then no pooler, proxy or NAT sits in between. False when it
        cannot tell (a Unix socket: no address to compare)."""
        try:
            with socket.socket(fileno=os.dup(probe.pgconn.socket)) as ours:
                here, there = ours.getsockname(), ours.getpeername()
        except OSError:
            return False
        if not (isinstance(here, tuple) and isinstance(there, tuple)):
            return False  # a Unix socket
        with self._watch.watching(probe):
            row = probe.execute(self._q["session_ends"], prepare=False).fetchone()
        if row is None or any(value is None for value in row):
            return False
        try:
            seen = (_ip(row[0]), int(row[1]), _ip(row[2]), int(row[3]))
            known = (_ip(here[0]), int(here[1]), _ip(there[0]), int(there[1]))
        except ValueError:
            return False
        direct = seen == known
        if direct:
            events.debug(
                "jobs.postgres.pooler",
                url=self.display_url,
                found="none",
                cause=f"the probe's NOTIFY took over {self._probe_wait:g} s on a direct connection",
            )
        return direct

    def _signal(self) -> None:
        with self._listener.cond:
            self._wake_seq += 1
            self._listener.cond.notify_all()

    def _woke(self, jobs: Sequence[NewJob]) -> None:
        """Jobs of ours committed: wake this process's waiters at once when polling (with
        LISTEN, the NOTIFY does), and let the next look know they are not news."""
        if jobs and not self._listen:
            newest = max(ids_of(jobs))
            if self._looked and (self._newest is None or newest > self._newest):
                self._newest = newest
            self._signal()


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address, an IPv4-mapped IPv6 one as its IPv4 address."""
    address = ipaddress.ip_address(text.split("%")[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def _heard(probe: Any, payloads: set[str], timeout: float, clock: Clock) -> bool:
    """Whether one of ``payloads`` reaches ``probe`` within ``timeout`` seconds."""
    deadline = clock.monotonic() + timeout
    while (remaining := deadline - clock.monotonic()) > 0:
        for note in probe.notifies(timeout=remaining, stop_after=1):
            if note.payload in payloads:
                return True
    return False

"""A loopback TCP proxy for fault tests: forwards bytes, and can be told to stall or reset.

``Proxy(port)`` listens on a free ``127.0.0.1`` port (``proxy.port``) and forwards every
connection to ``127.0.0.1:port``, on one thread (a selector). ``stall()`` stops forwarding in
both directions while every socket stays open: the peer's kernel still acknowledges what is
sent, so neither TCP keepalives nor ``tcp_user_timeout`` notice anything (a hung pooler or
proxy, as seen from the client); connections accepted meanwhile are held too. ``resume()``
forwards again, buffered bytes first. ``reset()`` aborts every open connection with a TCP
reset, both sides. ``close()`` (a context manager exit) resets and stops.

Loopback only, test traffic only: it connects nowhere but the port it was given.
"""

from __future__ import annotations

import selectors
import socket
import struct
import threading
from types import TracebackType

__all__ = ["Proxy"]


class Proxy:
    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._waker_r, self._waker_w = socket.socketpair()
        self._sel.register(self._waker_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._pairs: dict[socket.socket, socket.socket] = {}  # each side to its peer
        self._stalled = False
        self._closed = False
        self._resets: list[threading.Event] = []
        #: Connections accepted so far (a test can tell a reconnect from a reused one).
        self.accepted = 0
        self._thread = threading.Thread(target=self._run, name="tcpproxy", daemon=True)
        self._thread.start()

    # -- control -------------------------------------------------------------------------------

    def stall(self) -> None:
        with self._lock:
            self._stalled = True
        self._poke()

    def resume(self) -> None:
        with self._lock:
            self._stalled = False
        self._poke()

    def reset(self) -> None:
        """Abort every open connection with a TCP RST (SO_LINGER 0), on the proxy's thread
        (the only one that touches the selector); returns once done."""
        done = threading.Event()
        with self._lock:
            self._resets.append(done)
        self._poke()
        if self._thread.is_alive():
            done.wait(5)

    def close(self) -> None:
        self.reset()
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._poke()
        self._thread.join(5)
        for sock in (self._listener, self._waker_r, self._waker_w):
            sock.close()
        self._sel.close()

    def __enter__(self) -> Proxy:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------------------------

    def _poke(self) -> None:
        try:
            self._waker_w.send(b"x")
        except OSError:
            pass

    def _abort(self, sock: socket.socket) -> None:
        try:
            self._sel.unregister(sock)
        except (KeyError, ValueError):
            pass
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        sock.close()

    def _watch(self, forwarding: bool) -> None:
        """Read from every pair's sockets while forwarding; from none while stalled."""
        for side in list(self._pairs):
            registered = side in self._sel.get_map()
            if forwarding and not registered:
                self._sel.register(side, selectors.EVENT_READ, None)
            elif not forwarding and registered:
                self._sel.unregister(side)

    def _run(self) -> None:
        while True:
            with self._lock:
                if self._closed:
                    return
                resets, self._resets = self._resets, []
                if resets:
                    sides = list(self._pairs)
                    self._pairs.clear()
                    for side in sides:
                        self._abort(side)
                self._watch(not self._stalled)
            for done in resets:
                done.set()
            for key, _ in self._sel.select(timeout=0.5):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                if sock is self._waker_r:
                    sock.recv(4096)
                elif sock is self._listener:
                    self._accept()
                else:
                    self._forward(sock)

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        try:
            upstream = socket.create_connection(self.target, timeout=5)
        except OSError:
            self._abort(client)
            return
        for side in (client, upstream):
            side.setblocking(True)
            side.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            self.accepted += 1
            self._pairs[client] = upstream
            self._pairs[upstream] = client

    def _forward(self, sock: socket.socket) -> None:
        with self._lock:
            peer = self._pairs.get(sock)
            if peer is None or self._stalled:
                return
        try:
            data = sock.recv(65536)
            if data:
                peer.sendall(data)
                return
        except OSError:
            pass
        with self._lock:  # one side closed: close both
            self._pairs.pop(sock, None)
            self._pairs.pop(peer, None)
        for side in (sock, peer):
            try:
                self._sel.unregister(side)
            except (KeyError, ValueError):
                pass
            side.close()

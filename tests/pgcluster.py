"""A throwaway PostgreSQL cluster for tests: initdb into a temp dir, start, stop, crash.

``Cluster.create()`` runs ``initdb`` (trust auth, superuser ``postgres``) into a fresh temp
directory and ``Cluster.start()`` runs the postmaster with ``pg_ctl`` on a free loopback port,
with its unix socket in the same directory, ``fsync`` on and ``max_connections=200``.
``stop(mode="immediate")`` is a crash as far as the server is concerned (no shutdown
checkpoint; the next start runs crash recovery); ``terminate_backends`` kills sessions by
application name, the way an operator or a failover would.

Binaries are found on ``PATH`` or under ``/usr/lib/postgresql/*/bin`` (newest version first).
PostgreSQL refuses to run as root: when the effective uid is 0 every server command runs as the
``postgres`` system user through ``runuser -u postgres --`` (the user is created with
``useradd --system`` when missing), and the temp directory is handed to that user. The
directory is created with ``tempfile.mkdtemp`` under the system temp dir rather than pytest's
``tmp_path``, whose root-only parents that user could not enter.

``Bouncer.start(cluster)`` puts PgBouncer (Debian's ``pgbouncer``, found on PATH or in
/usr/sbin) in front of a cluster, in transaction-pooling mode, on a free loopback port: its own
config and auth files in a temp dir, run in the foreground as a subprocess (as the ``postgres``
user when root, set on the process itself: PgBouncer refuses to run as root), every database
name mapped to the cluster.

Limits: POSIX only; one postmaster per ``Cluster``; ``close()`` (also run at interpreter exit)
stops the server (or the bouncer) and deletes the directory.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Literal

import psycopg

__all__ = ["Bouncer", "Cluster", "ClusterError", "find_bindir", "find_pgbouncer"]

SERVICE_USER = "postgres"
StopMode = Literal["smart", "fast", "immediate"]


class ClusterError(RuntimeError):
    """The throwaway cluster could not be created, started or stopped."""


def find_bindir() -> Path | None:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``, or None."""
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(os.path.realpath(on_path)).parent
    candidates = glob.glob("/usr/lib/postgresql/*/bin")

    def version(path: str) -> float:
        try:
            return float(Path(path).parent.name)
        except ValueError:
            return 0.0

    for bindir in sorted(candidates, key=version, reverse=True):
        if all((Path(bindir) / exe).exists() for exe in ("initdb", "pg_ctl", "postgres")):
            return Path(bindir)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _need_service_user() -> bool:
    return os.geteuid() == 0


def _ensure_service_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(SERVICE_USER)
    except KeyError:
        subprocess.run(
            [
                "useradd",
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                SERVICE_USER,
            ],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(SERVICE_USER)


class Cluster:
    """One throwaway PostgreSQL cluster. Create with ``Cluster.create()``."""

    def __init__(self, root: Path, bindir: Path, port: int) -> None:
        self.root = root
        self.bindir = bindir
        self.port = port
        self.datadir = root / "data"
        self.sockdir = root / "sock"
        self.logfile = root / "server.log"
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------

    @classmethod
    def create(cls, bindir: Path | None = None, *, start: bool = True) -> Cluster:
        """initdb into a new temp dir (and start the server unless ``start=False``)."""
        found = bindir or find_bindir()
        if found is None:
            raise ClusterError(
                "no PostgreSQL binaries (initdb, pg_ctl) on PATH or in /usr/lib/postgresql/*/bin"
            )
        root = Path(tempfile.mkdtemp(prefix="u3j-pg-"))
        cluster = cls(root, found, _free_port())
        atexit.register(cluster.close)
        cluster.sockdir.mkdir()
        if _need_service_user():
            user = _ensure_service_user()
            for path in (root, cluster.sockdir):
                os.chown(path, user.pw_uid, user.pw_gid)
        cluster._run(
            "initdb",
            "--pgdata",
            str(cluster.datadir),
            "--username",
            "postgres",
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--locale",
            "C.UTF-8",
            "--no-sync",  # the data dir is thrown away; the server itself runs with fsync on
        )
        if start:
            cluster.start()
        return cluster

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until it accepts connections."""
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={self.sockdir}",
                "-c fsync=on",
                "-c max_connections=200",
            ]
        )
        self._run(
            "pg_ctl",
            "start",
            "--pgdata",
            str(self.datadir),
            "--log",
            str(self.logfile),
            "--wait",
            "--timeout",
            str(int(timeout)),
            "-o",
            options,
        )
        deadline = time.monotonic() + timeout
        while True:  # pg_ctl -w can return while a crash recovery still refuses logins
            try:
                with psycopg.connect(self.dsn("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"server did not accept connections; log:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.05)

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server. ``immediate`` is a crash: no checkpoint, recovery on next start."""
        self._run("pg_ctl", "stop", "--pgdata", str(self.datadir), "--mode", mode, "--wait")

    def restart(self, mode: StopMode = "fast") -> None:
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        result = self._run("pg_ctl", "status", "--pgdata", str(self.datadir), check=False)
        return result.returncode == 0

    def close(self) -> None:
        """Stop the server (if running) and delete its directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            if self.is_running():
                self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)

    # -- use ---------------------------------------------------------------------------------

    def dsn(self, dbname: str = "postgres") -> str:
        """A libpq conninfo string reaching ``dbname`` over TCP on the loopback address."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def terminate_backends(self, application_name: str) -> int:
        """``pg_terminate_backend`` every session whose application_name matches the LIKE
        pattern ``application_name``; return how many were terminated."""
        with psycopg.connect(self.dsn("postgres"), autocommit=True) as conn:
            row = conn.execute(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE backend_type = 'client backend' AND application_name LIKE %s"
                " AND pid <> pg_backend_pid()",
                (application_name,),
            ).fetchone()
        return int(row[0]) if row else 0

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    # -- internals -------------------------------------------------------------------------

    def _run(self, exe: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [str(self.bindir / exe), *args]
        if _need_service_user():
            argv = ["runuser", "-u", SERVICE_USER, "--", *argv]
        result = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            check=False,
            cwd=self.root,
            stdin=subprocess.DEVNULL,
        )
        if check and result.returncode != 0:
            raise ClusterError(
                f"{exe} {' '.join(args[:2])} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{self.log_tail()}"
            )
        return result


def find_pgbouncer() -> Path | None:
    """The ``pgbouncer`` executable, or None."""
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.path.exists(p)), None
    )
    return Path(found) if found else None


class Bouncer:
    """PgBouncer in transaction-pooling mode in front of one ``Cluster``."""

    def __init__(self, root: Path, port: int, proc: subprocess.Popen[bytes]) -> None:
        self.root = root
        self.port = port
        self.logfile = root / "pgbouncer.log"
        self._proc = proc
        self._closed = False

    @classmethod
    def start(cls, cluster: Cluster, *, exe: Path | None = None, timeout: float = 30.0) -> Bouncer:
        found = exe or find_pgbouncer()
        if found is None:
            raise ClusterError("pgbouncer is not installed (apt-get install pgbouncer)")
        root = Path(tempfile.mkdtemp(prefix="u3j-pgb-"))
        port = _free_port()
        (root / "users.txt").write_text('"postgres" ""\n')
        (root / "pgbouncer.ini").write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host=127.0.0.1 port={cluster.port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {root / 'users.txt'}",
                    "pool_mode = transaction",
                    "max_client_conn = 1000",
                    "default_pool_size = 20",
                    # Test databases are dropped WITH (FORCE) while the pooler holds server
                    # connections to them; give up on a dead one at once.
                    "server_login_retry = 1",
                    "server_connect_timeout = 5",
                    f"logfile = {root / 'pgbouncer.log'}",
                    "admin_users = postgres",
                    "",
                ]
            )
        )
        # As root, the process itself runs as the service user (not under ``runuser``, which
        # passes SIGTERM on and then waits 2 s before it kills: close() would wait them).
        uid = gid = None
        if _need_service_user():
            user = _ensure_service_user()
            uid, gid = user.pw_uid, user.pw_gid
            for path in (root, root / "users.txt", root / "pgbouncer.ini"):
                os.chown(path, uid, gid)
        proc = subprocess.Popen(
            [str(found), str(root / "pgbouncer.ini")],
            cwd=root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=uid,
            group=gid,
            extra_groups=None if uid is None else [],
        )
        bouncer = cls(root, port, proc)
        atexit.register(bouncer.close)
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(bouncer.dsn("postgres"), connect_timeout=2):
                    return bouncer
            except psycopg.OperationalError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = bouncer.log_tail()
                    bouncer.close()
                    raise ClusterError(f"pgbouncer did not start; log:\n{log}") from None
                time.sleep(0.05)

    def dsn(self, dbname: str) -> str:
        """A libpq conninfo string reaching ``dbname`` through the pooler."""
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.logfile.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no pgbouncer log)"

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

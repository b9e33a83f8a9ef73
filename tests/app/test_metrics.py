"""Prometheus metrics scraped over HTTP from real worker processes after a drain: one
process serving its own, and a pool of two serving their sum."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import types
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ultimat3.jobs import App, job
from ultimat3.jobs.testing import FakeClock

from .processes import HERE, wait_until

WORKER = (sys.executable, "-m", "ultimat3.jobs", "--app", "faultjobs:app", "worker")
FAST = ("--concurrency", "4", "--poll-interval", "50ms", "--lease", "2s")


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "ULTIMAT3_JOBS_URL": f"sqlite:///{tmp_path / 'metrics.sqlite3'}",
        "FAULT_LEDGER": str(tmp_path / "ledger.txt"),
        "PYTHONPATH": str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _scrapes(port: int) -> bool:
    try:
        _scrape(port)
    except OSError:
        return False
    return True


def _drain(fault_app: App, spawn, *args: str) -> tuple[int, object]:  # type: ignore[no-untyped-def]
    import faultjobs

    fault_app.enqueue_many(faultjobs.ledger, [{}] * 40)
    fault_app.enqueue_many(faultjobs.raises, [{}] * 3)
    port = _port()
    proc = spawn(*FAST, "--metrics-port", str(port), *args)
    wait_until(
        lambda: (
            fault_app.count_jobs(state="completed") == 40
            and fault_app.count_jobs(state="dead") == 3
        ),
        60,
        "the drain",
    )
    wait_until(lambda: _scrapes(port), 30, "the metrics endpoint")
    return port, proc


def _listening_on(port: int) -> str:
    """The IPv4 address a listening socket on ``port`` is bound to (Linux's /proc/net/tcp)."""
    table = Path("/proc/net/tcp")
    if not table.exists():
        pytest.skip("needs Linux's /proc/net/tcp")
    for row in table.read_text().splitlines()[1:]:
        local, state = row.split()[1], row.split()[3]
        address, _, hex_port = local.partition(":")
        if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
            return socket.inet_ntoa(bytes.fromhex(address)[::-1])
    raise AssertionError(f"nothing listens on port {port}")


def test_metrics_host_chooses_the_address(env: dict[str, str]) -> None:
    port = _port()
    proc = subprocess.Popen(
        [*WORKER, "--metrics-port", str(port), "--metrics-host", "0.0.0.0"],
        env=env,
        cwd=HERE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(lambda: _scrapes(port), 30, "the metrics endpoint")
        assert _listening_on(port) == "0.0.0.0"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert f"INFO metrics on http://0.0.0.0:{port}/metrics" in stderr, stderr


def _k(name: str, **labels: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    return name, tuple(sorted(labels.items()))


def _check_drain(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> None:
    outcomes = "ultimat3_jobs_outcomes_total"
    q = "default"
    assert samples[_k(outcomes, job="ledger", queue=q, outcome="completed")] == 40
    assert samples[_k(outcomes, job="raises", queue=q, outcome="retried")] == 3
    assert samples[_k(outcomes, job="raises", queue=q, outcome="dead")] == 3
    assert samples[_k("ultimat3_jobs_retried_total", job="raises", queue=q)] == 3
    assert samples[_k("ultimat3_jobs_dead_total", job="raises", queue=q)] == 3
    duration = "ultimat3_jobs_duration_seconds_count"
    # One vocabulary: the duration's outcome label is the outcomes counter's.
    assert samples[_k(duration, job="ledger", queue=q, outcome="completed")] == 40
    assert samples[_k(duration, job="raises", queue=q, outcome="retried")] == 3
    assert samples[_k(duration, job="raises", queue=q, outcome="dead")] == 3
    latency = "ultimat3_jobs_queue_latency_seconds"
    assert samples[_k(f"{latency}_count", job="ledger", queue=q)] == 40
    assert samples[_k(f"{latency}_sum", job="ledger", queue=q)] >= 0
    assert samples[_k("ultimat3_jobs_depth", queue=q, state="completed")] == 40
    assert samples[_k("ultimat3_jobs_depth", queue=q, state="dead")] == 3
    assert samples[_k("ultimat3_jobs_oldest_ready_age_seconds", queue=q)] == 0
    assert samples[_k("ultimat3_jobs_database_up")] == 1


def test_one_worker_process_serves_its_metrics(
    fault_app: App,
    spawn,  # type: ignore[no-untyped-def]
) -> None:
    port, proc = _drain(fault_app, spawn)
    samples = _scrape(port)
    _check_drain(samples)
    assert samples[_k("ultimat3_jobs_workers_live")] == 1
    assert _listening_on(port) == "127.0.0.1"  # loopback only, by default
    proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    assert proc.wait(30) == 0  # type: ignore[attr-defined]


def test_a_pool_serves_the_sum_of_its_processes(
    fault_app: App,
    spawn,  # type: ignore[no-untyped-def]
) -> None:
    port, proc = _drain(fault_app, spawn, "--processes", "2")
    pid = proc.pid  # type: ignore[attr-defined]
    (folder,) = Path(tempfile.gettempdir()).glob(f"ultimat3-jobs-metrics-{pid}-*")
    assert len(list(folder.glob("*.db"))) >= 2  # the children's files
    wait_until(lambda: len(fault_app.workers()) == 2, 30, "both children's rows")
    samples = _scrape(port)
    _check_drain(samples)
    assert samples[_k("ultimat3_jobs_workers_live")] == 2
    pids = {w.pid for w in fault_app.workers()}
    assert proc.pid not in pids  # type: ignore[attr-defined]
    proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
    assert proc.wait(60) == 0  # type: ignore[attr-defined]
    pid = proc.pid  # type: ignore[attr-defined]
    assert list(Path(tempfile.gettempdir()).glob(f"ultimat3-jobs-metrics-{pid}-*")) == []


def test_a_port_in_use_is_an_explained_error(env: dict[str, str]) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*WORKER, "--metrics-port", str(port)],
            env=env,
            cwd=HERE,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1
    assert f"error: --metrics-port {port}: cannot listen on 127.0.0.1:{port}" in done.stderr
    assert "fix: choose a free port" in done.stderr


def test_the_gauges_read_the_apps_clock(
    sqlite_url: str, clock: FakeClock, make_module: Callable[..., types.ModuleType]
) -> None:
    """The oldest ready job's age is measured on the app's clock, as its due time was."""
    from ultimat3.jobs.prometheus import DatabaseCollector

    @job
    def waits(input: int) -> None:
        return None

    app = App(sqlite_url, modules=[make_module(waits=waits)], clock=clock)
    try:
        app.enqueue(waits, 1)
        clock.advance(90)
        gauges = {
            (s.name, s.labels.get("queue")): s.value
            for family in DatabaseCollector(app).collect()
            for s in family.samples
        }
    finally:
        app.close()
    assert gauges[("ultimat3_jobs_oldest_ready_age_seconds", "default")] == 90
    assert gauges[("ultimat3_jobs_database_up", None)] == 1

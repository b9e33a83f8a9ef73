"""Prometheus metrics (the ``[prometheus]`` extra): a subscriber of ``ultimat3.jobs.events``
for the counters and histograms, and a collector that reads the database at scrape time for
the gauges. ``worker --metrics-port PORT`` serves them, on 127.0.0.1 unless
``--metrics-host`` says otherwise; nothing is served by default.

- Counters: ``ultimat3_jobs_enqueued_total``, ``ultimat3_jobs_outcomes_total{outcome}``
  (completed, retried, dead, snoozed, cancelled: each written outcome),
  ``ultimat3_jobs_retried_total``, ``ultimat3_jobs_dead_total``,
  ``ultimat3_jobs_rescued_total``; each by ``queue`` and ``job``.
- Histograms: ``ultimat3_jobs_duration_seconds`` (how long a job's function ran, by
  ``queue``, ``job`` and ``outcome``: the outcomes' one vocabulary, ``events.OUTCOMES``,
  released included), ``ultimat3_jobs_queue_latency_seconds`` (due time to
  start, by ``queue`` and ``job``).
- Gauges, read from the database when scraped: ``ultimat3_jobs_depth{queue,state}``,
  ``ultimat3_jobs_oldest_ready_age_seconds{queue}``, ``ultimat3_jobs_workers_live``,
  ``ultimat3_jobs_database_up`` (0 when the read failed).

Labels are bounded: queue, job name and outcome; ``tenant`` only with ``tenant=True``
(``--metrics-tenant``), for a bounded set of tenants.

**Several processes** (``worker --processes N``): prometheus_client's multiprocess mode. The
pool sets ``PROMETHEUS_MULTIPROC_DIR`` to a temporary folder of its own before its children
start; each child writes its counters and histograms there, and the pool alone serves the
port, summing the children's files (and reading the gauges once). The folder is removed when
the pool exits.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ultimat3.jobs import events
from ultimat3.jobs.errors import ConfigurationError, missing_extra

try:
    import prometheus_client
    from prometheus_client import CollectorRegistry, Counter, Histogram
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # pragma: no cover - the extra is installed in the tests
    raise missing_extra("worker metrics (--metrics-port)", "prometheus", exc) from exc

if TYPE_CHECKING:
    from ultimat3.jobs.app import App

__all__ = ["DatabaseCollector", "Metrics", "serve"]

#: The event written for each outcome (a released job has none), and its outcome.
_OUTCOMES = {f"jobs.job.{word}": word for word in events.OUTCOMES if word != "released"}
#: Latencies from a millisecond to an hour.
_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)


class Metrics:
    """The counters and histograms, fed by the events (``subscribe()``)."""

    def __init__(self, *, registry: CollectorRegistry | None = None, tenant: bool = False) -> None:
        self.tenant = tenant
        where = registry if registry is not None else prometheus_client.REGISTRY
        job = ["queue", "job", *(["tenant"] if tenant else [])]
        self.enqueued = Counter(
            "ultimat3_jobs_enqueued", "Jobs inserted (deduped ones too).", job, registry=where
        )
        self.outcomes = Counter(
            "ultimat3_jobs_outcomes",
            "Outcomes written: completed, retried, dead, snoozed, cancelled.",
            [*job, "outcome"],
            registry=where,
        )
        self.retried = Counter(
            "ultimat3_jobs_retried", "Failed attempts that will be retried.", job, registry=where
        )
        self.dead = Counter(
            "ultimat3_jobs_dead", "Jobs that used their last attempt.", job, registry=where
        )
        self.rescued = Counter(
            "ultimat3_jobs_rescued",
            "Jobs rescued by a worker because the worker that ran them vanished (lease expired).",
            job,
            registry=where,
        )
        self.duration = Histogram(
            "ultimat3_jobs_duration_seconds",
            "How long a job's function ran.",
            [*job, "outcome"],
            buckets=_BUCKETS,
            registry=where,
        )
        self.latency = Histogram(
            "ultimat3_jobs_queue_latency_seconds",
            "From a job's due time to its start.",
            job,
            buckets=_BUCKETS,
            registry=where,
        )
        self._subscription: events.Subscription | None = None

    def subscribe(self) -> Metrics:
        """Start counting this process's job events; returns self."""
        names = [
            "jobs.job.enqueued",
            "jobs.job.started",
            "jobs.job.finished",
            "jobs.job.rescued",
            *_OUTCOMES,
        ]
        self._subscription = events.subscribe(self, names=names)
        return self

    def close(self) -> None:
        """Stop counting (the metrics keep their values)."""
        if self._subscription is not None:
            self._subscription.close()
            self._subscription = None

    def _labels(self, fields: dict[str, Any]) -> list[str]:
        labels = [str(fields.get("queue")), str(fields.get("job"))]
        if self.tenant:
            tenant = fields.get("tenant")
            labels.append("" if tenant is None else str(tenant))
        return labels

    def __call__(self, event: events.Event) -> None:
        name, fields = event.name, event.fields
        labels = self._labels(fields)
        outcome = _OUTCOMES.get(name)
        if outcome is not None:
            self.outcomes.labels(*labels, outcome).inc()
            if outcome == "retried":
                self.retried.labels(*labels).inc()
            elif outcome == "dead":
                self.dead.labels(*labels).inc()
        elif name == "jobs.job.started":
            latency = fields.get("queue_latency")
            if latency is not None:
                self.latency.labels(*labels).observe(latency)
        elif name == "jobs.job.finished":
            self.duration.labels(*labels, fields.get("outcome", "")).observe(fields["duration"])
        elif name == "jobs.job.enqueued":
            self.enqueued.labels(*labels).inc()
        elif name == "jobs.job.rescued":
            self.rescued.labels(*labels).inc()


class DatabaseCollector(Collector):
    """The gauges, read from the job database when scraped (one ``queue_list`` and one
    ``worker_list``: kept counts, a few rows whatever the number of jobs)."""

    def __init__(self, app: App, *, worker_stale: float = 60.0) -> None:
        self.app = app
        self.worker_stale = worker_stale

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """The gauges, read now (Prometheus's client calls it on each scrape)."""
        depth = GaugeMetricFamily(
            "ultimat3_jobs_depth", "Jobs by queue and state.", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "ultimat3_jobs_oldest_ready_age_seconds",
            "How long the oldest job due in each queue has waited (0: none is due).",
            labels=["queue"],
        )
        workers = GaugeMetricFamily(
            "ultimat3_jobs_workers_live", "Worker processes with a recent heartbeat."
        )
        up = GaugeMetricFamily(
            "ultimat3_jobs_database_up", "1 when the job database answered this scrape."
        )
        try:
            queues = self.app.queues()
            rows = self.app.workers()
        except Exception:  # a scrape must answer; the gauge says the database did not
            up.add_metric([], 0)
            yield up
            return
        now = self.app.clock.now()
        for queue in queues:
            for state, n in sorted(queue.counts.items()):
                depth.add_metric([queue.name, state.value], n)
            age = 0.0
            if queue.oldest_ready_at is not None:
                age = max(0.0, (now - queue.oldest_ready_at).total_seconds())
            oldest.add_metric([queue.name], age)
        live = [w for w in rows if (now - w.heartbeat_at).total_seconds() <= self.worker_stale]
        workers.add_metric([], len(live))
        up.add_metric([], 1)
        yield from (depth, oldest, workers, up)


def serve(
    port: int, app: App, *, pool_dir: str | None = None, addr: str = "127.0.0.1"
) -> CollectorRegistry:
    """Serve ``/metrics`` on ``port`` (in a daemon thread): this process's metrics, or, with
    ``pool_dir``, the sum of a pool's children's; plus the database gauges."""
    from prometheus_client import multiprocess, start_http_server

    if pool_dir is not None:
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry, path=pool_dir)  # type: ignore[no-untyped-call]
    else:
        registry = prometheus_client.REGISTRY
    registry.register(DatabaseCollector(app))
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        raise ConfigurationError(
            f"--metrics-port {port}: cannot listen on {addr}:{port}: {exc.strerror or exc}",
            fix="choose a free port, or stop what listens on it",
        ) from exc
    return registry

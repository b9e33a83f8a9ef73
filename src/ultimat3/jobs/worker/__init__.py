"""The worker: claims due jobs, runs them, records what happened (``service.Worker``).

- ``service``: the ``Worker`` (its lifecycle, the cycle loop that feeds the handler threads,
  shutdown and inline draining);
- ``writes``: the one transaction of a turn (write outcomes, claim), and the rarer writes;
- ``handlers``: running one job and turning what happened into an ``Outcome``;
- ``beat``: the heartbeat and renew loops, and the presence step;
- ``config``: ``WorkerConfig``, ``WorkerStats`` and the exit codes.
"""

from ultimat3.jobs.worker.config import FATAL_EXIT, StuckError, WorkerConfig, WorkerStats
from ultimat3.jobs.worker.handlers import Outcome
from ultimat3.jobs.worker.service import Worker

__all__ = ["FATAL_EXIT", "Outcome", "StuckError", "Worker", "WorkerConfig", "WorkerStats"]

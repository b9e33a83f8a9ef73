"""The App the relay processes of test_faults.py load (``--app relayapp:app``): jobs in
``$ULTIMAT3_JOBS_URL``, outbox at ``$RELAY_OUTBOX_URL``."""

from __future__ import annotations

import os
import sys
from typing import Any

from ultimat3.jobs import App, job


@job(idempotency_key=lambda value: f"n-{value['n']}")
def keyed(value: Any) -> None:
    pass


@job
def unkeyed(value: Any) -> None:
    pass


app = App(modules=[sys.modules[__name__]], outbox=os.environ["RELAY_OUTBOX_URL"])

"""``python -m ultimat3.jobs`` is the ``ultimat3-jobs`` command."""

from ultimat3.jobs.cli import main

main()

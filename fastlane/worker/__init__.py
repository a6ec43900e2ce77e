"""The worker SDK: :class:`Worker` runs async handlers for the runs nodes assign, with a :class:`RunContext`.

:func:`apply_once` (from :mod:`fastlane.worker.effects`) makes a handler's side effect happen once
per run even when the run is delivered again. :func:`run_worker_cli` is ``fastlane worker``.
The modules whose names start with ``_`` are private: the set of node streams, one stream, and
the running handlers.
"""

from fastlane.worker._cli import run_worker_cli
from fastlane.worker._clock import ClockEstimate
from fastlane.worker.effects import apply_once
from fastlane.worker.sdk import Handler, RunContext, Worker

__all__ = ["ClockEstimate", "Handler", "RunContext", "Worker", "apply_once", "run_worker_cli"]

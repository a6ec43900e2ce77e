"""Child processes of fastlane for benchmarks: daemons and workers on 127.0.0.1.

They live in the test kit (:mod:`fastlane.testing.processes`), shared with the test suite. What
the harness adds is its own repository: ``ROOT`` is the checkout this harness runs from, which
may differ from ``FASTLANE_ROOT``, the checkout of the fastlane being measured (PYTHONPATH naming
another one, for a before/after pair of commits). This package is found through the editable
install's mapping of bench/, so ROOT is always the installed repository.
"""

from __future__ import annotations

from pathlib import Path

from fastlane.testing import processes as _kit
from fastlane.testing.processes import (  # noqa: F401
    FASTLANE_ROOT,
    STOP_TIMEOUT,
    Daemon,
    Process,
    WorkerProcess,
    free_port,
)

ROOT = Path(__file__).resolve().parent.parent


def child_environment(*extra_paths: Path, **variables: str) -> dict[str, str]:
    """This environment, with the measured fastlane, then the harness's repository (and
    ``extra_paths`` before both) importable, and output unbuffered."""
    return _kit.child_environment(*extra_paths, FASTLANE_ROOT, ROOT, **variables)

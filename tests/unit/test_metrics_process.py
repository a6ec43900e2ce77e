"""A node's metrics say what process answers: its RSS, CPU and open files (``process_*``), and
which fastlane and Python it runs (``fastlane_build_info``), also through the pseudonymised view
``/metrics`` serves under ``--auth``."""

from __future__ import annotations

import platform

from prometheus_client import generate_latest

from fastlane.runtime.metrics import Metrics
from fastlane.runtime.version import installed_version


def test_a_node_exports_its_process_and_build_in_clear_and_under_pseudonyms() -> None:
    metrics = Metrics()
    registry = metrics.registry
    assert (registry.get_sample_value("process_resident_memory_bytes") or 0) > 1_000_000
    assert (registry.get_sample_value("process_open_fds") or 0) >= 3
    assert registry.get_sample_value("fastlane_build_info", {"version": installed_version(),
                                                              "python": platform.python_version()}) == 1
    served = generate_latest(metrics.exposed(names_in_clear=False, secret=b"k")).decode()
    assert "process_cpu_seconds_total " in served and f'version="{installed_version()}"' in served

"""The worker's request for short CPU slices reaches the kernel, for its own thread only."""

from __future__ import annotations

import ctypes
import platform
import sys
import threading
from datetime import timedelta

import pytest

from fastlane.errors import ConfigurationError
from fastlane.worker import Worker
from fastlane.worker._slice import _SchedAttr, request_cpu_slice

_SCHED_GETATTR = {"x86_64": 315, "aarch64": 275}
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.machine() not in _SCHED_GETATTR,
                                reason="sched_setattr is Linux's, called here on x86_64 and aarch64")


def slice_of_this_thread() -> int:
    attr = _SchedAttr()
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.syscall(_SCHED_GETATTR[platform.machine()], 0, ctypes.byref(attr), ctypes.sizeof(attr), 0) == 0
    return attr.sched_runtime


@linux_only
def test_the_calling_thread_gets_the_slice_and_other_threads_keep_theirs():
    seen: dict[str, int] = {}

    def in_thread() -> None:
        seen["before"] = slice_of_this_thread()
        seen["accepted"] = request_cpu_slice(timedelta(microseconds=250))
        seen["after"] = slice_of_this_thread()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen["accepted"] and seen["after"] == 250_000 != seen["before"]
    assert slice_of_this_thread() == seen["before"]  # this thread was not touched


@linux_only
def test_a_slice_out_of_the_kernels_range_is_clamped_to_it():
    seen: dict[str, int] = {}

    def in_thread() -> None:
        request_cpu_slice(timedelta(microseconds=1))
        seen["slice"] = slice_of_this_thread()

    thread = threading.Thread(target=in_thread)
    thread.start()
    thread.join()
    assert seen["slice"] == 100_000


@pytest.mark.parametrize("length", [timedelta(microseconds=50), timedelta(seconds=1)])
def test_a_worker_refuses_a_slice_the_kernel_would_not_give(length: timedelta) -> None:
    with pytest.raises(ConfigurationError, match="cpu_slice"):
        Worker(cpu_slice=length)

"""A short CPU time slice for the worker's event-loop thread, so that it starts held runs on
their instant also on a busy machine.

When a held run's alarm rings, the loop thread wakes; if another task (a neighbouring process's
busy thread) has the CPU, Linux's scheduler (EEVDF, since 6.6) lets the woken thread take the CPU
only if its virtual deadline is the earlier one, and that deadline is the thread's time slice
after its virtual runtime: with the default slice (a millisecond or more, which the kernel scales
with the number of CPUs), a thread often waits for the running one's slice to end. Since Linux 6.12 a normal thread may ask
for a shorter slice (``sched_setattr`` with ``sched_runtime``; no privilege needed, 0.1 to 100 ms):
it then wakes with an early deadline and preempts at once. Its share of the CPU does not change,
only how finely it is cut; a loop that mostly sleeps until its next instant is the case the
feature was made for. The request is for the calling thread only: gRPC's threads keep theirs.

Elsewhere (another OS, an architecture without the syscall number below, an older kernel that
refuses the call) nothing changes and the worker logs why at debug level. Older 6.x kernels
accept the call and ignore the slice.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform
import sys
from datetime import timedelta

log = logging.getLogger("fastlane.worker")

_SCHED_OTHER = 0
_SCHED_FLAG_RESET_ON_FORK = 0x01
_SCHED_SETATTR = {"x86_64": 314, "aarch64": 274}  # the syscall's number per architecture
MIN_SLICE, MAX_SLICE = timedelta(microseconds=100), timedelta(milliseconds=100)  # the kernel's clamp


class _SchedAttr(ctypes.Structure):
    _fields_ = [  # struct sched_attr, version 1 (include/uapi/linux/sched/types.h)
        ("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
        ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32), ("sched_runtime", ctypes.c_uint64),
        ("sched_deadline", ctypes.c_uint64), ("sched_period", ctypes.c_uint64),
        ("sched_util_min", ctypes.c_uint32), ("sched_util_max", ctypes.c_uint32),
    ]


def request_cpu_slice(length: timedelta) -> bool:
    """Ask the kernel to give the calling thread time slices of ``length``; whether it accepted."""
    number = _SCHED_SETATTR.get(platform.machine())
    if not sys.platform.startswith("linux") or number is None:
        log.debug("no short CPU slice: not Linux on x86_64 or aarch64")
        return False
    micros = max(MIN_SLICE, min(length, MAX_SLICE)) // timedelta(microseconds=1)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        # A thread lowered from real-time priority keeps its reset-on-fork flag (``_realtime``):
        # without CAP_SYS_NICE the kernel refuses to clear it.
        flags = _SCHED_FLAG_RESET_ON_FORK if os.sched_getscheduler(0) & os.SCHED_RESET_ON_FORK else 0
        attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr), sched_policy=_SCHED_OTHER, sched_flags=flags,
                          sched_nice=os.getpriority(os.PRIO_PROCESS, 0), sched_runtime=micros * 1000)
        if libc.syscall(number, 0, ctypes.byref(attr), 0) != 0:
            log.debug("no short CPU slice: sched_setattr failed: %s", os.strerror(ctypes.get_errno()))
            return False
    except (OSError, AttributeError) as error:
        log.debug("no short CPU slice: %s", error)
        return False
    return True

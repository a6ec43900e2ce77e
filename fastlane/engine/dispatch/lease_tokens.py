"""Lease tokens: the credential of one attempt, random so that no attempt's lease token can be
derived from another's. (Not a fence token: that is a shard lease's, see :mod:`fastlane.engine.fencing`.)"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator

MAX_LEASE_TOKEN = (1 << 63) - 1  # lease_token columns are signed 64-bit integers


def new_lease_token() -> int:
    """A lease token nobody can guess: uniformly random in 1..2**63-1, a positive int64.

    It is the attempt's credential: whoever presents (run_id, lease_token) speaks for the
    attempt, so it must not be derivable from another attempt's lease token (a counter would be).
    Drawn from the operating system's CSPRNG a block at a time: a crowd of runs needs tens of
    thousands of tokens a second, and a system call for each would be a cost on the fire path."""
    for (value,) in _TOKEN_BLOCK:
        lease_token = value & MAX_LEASE_TOKEN
        if lease_token:
            return lease_token
    _TOKEN_BLOCK.refill()
    return new_lease_token()


class _TokenBlock:
    """Random 64-bit values read from ``os.urandom`` 4,096 at a time, each handed out once."""

    def __init__(self) -> None:
        self._values: Iterator[tuple[int]] = iter(())

    def __iter__(self) -> Iterator[tuple[int]]:
        return self._values

    def refill(self) -> None:
        self._values = struct.iter_unpack("<Q", os.urandom(8 * 4096))


_TOKEN_BLOCK = _TokenBlock()

"""How the SDK turns a payload given as a Python value into the bytes a job or trigger carries."""

from __future__ import annotations

from typing import Any

import orjson


def encode_payload(payload: Any) -> bytes:
    """The bytes sent for a payload: bytes as they are, None as nothing, anything else as JSON."""
    if payload is None:
        return b""
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    return orjson.dumps(payload)

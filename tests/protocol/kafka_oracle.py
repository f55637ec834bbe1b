"""Request frames built by kafka-python 3's ``kafka.protocol``: an independent encoder."""

from __future__ import annotations

from typing import Any


def request_frame(message: Any, correlation_id: int = 7, client_id: str | None = "oracle") -> bytes:
    """Header + body of a kafka-python request, without the size prefix."""
    message.with_header(correlation_id=correlation_id, client_id=client_id)
    return bytes(message.encode(header=True))


def uvarint(value: int) -> bytes:
    """An UNSIGNED_VARINT, for hand-made tagged fields."""
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)

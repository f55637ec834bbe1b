"""Kafka's length-prefixed framing: every request and response is one frame.

======  ======  =================================================
offset  bytes   field
======  ======  =================================================
0       4       size: int32, big-endian, bytes that follow (>= 0)
4       size    payload: request/response header + body
======  ======  =================================================

``FrameDecoder`` is sans-I/O: the connection feeds it whatever the socket returned and
takes out complete payloads. A size above ``max_frame_size`` (Kafka's
``socket.request.max.bytes``) or below zero raises before any payload is buffered, so
the server can close the connection without allocating the announced size.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from protocol.errors import FrameTooLargeError, InvalidFrameError

SIZE = struct.Struct(">i")
SIZE_BYTES = SIZE.size
DEFAULT_MAX_FRAME_SIZE = 104_857_600  # socket.request.max.bytes

Buffer = bytes | bytearray | memoryview


def check_frame_size(size: int, max_frame_size: int) -> None:
    """Refuse a size prefix before its payload is read or buffered."""
    if size < 0:
        raise InvalidFrameError(f"negative frame size {size}")
    if size > max_frame_size:
        raise FrameTooLargeError(size, max_frame_size)


class FrameDecoder:
    """Accumulates bytes and yields complete frame payloads (size prefix stripped).

    Each yielded payload is a read-only ``memoryview`` over a ``bytes`` object that no
    one else holds, so it stays valid and unchanged after later ``feed`` calls, and the
    kio decoder (which refuses writable buffers) can read it directly.
    """

    __slots__ = ("_buf", "_max_frame_size", "_need")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        self._buf = bytearray()
        self._max_frame_size = max_frame_size
        # Payload size of the frame being assembled, once its prefix has been read.
        self._need: int | None = None

    @property
    def buffered(self) -> int:
        """Bytes held that do not yet form a complete frame."""
        return len(self._buf)

    def feed(self, data: Buffer) -> list[memoryview]:
        """Add ``data``; return the frames it completed, in order (maybe none).

        Raises ``InvalidFrameError``/``FrameTooLargeError`` on a bad size prefix; the
        decoder is then unusable and the connection should be closed.
        """
        self._buf += data
        frames: list[memoryview] = []
        buf = self._buf
        pos = 0
        end = len(buf)
        with memoryview(buf) as view:
            while True:
                need = self._need
                if need is None:
                    if end - pos < SIZE_BYTES:
                        break
                    (need,) = SIZE.unpack_from(view, pos)
                    check_frame_size(need, self._max_frame_size)
                    pos += SIZE_BYTES
                    self._need = need
                if end - pos < need:
                    break
                # One copy out of the accumulation buffer: the frame then owns its bytes.
                frames.append(memoryview(view[pos : pos + need].tobytes()))
                pos += need
                self._need = None
        if pos:
            del buf[:pos]
        return frames


def encode_frame(parts: Iterable[Buffer]) -> list[Buffer]:
    """Prefix ``parts`` with their total size; the parts themselves are not copied.

    The result is meant for ``transport.writelines``.
    """
    out: list[Buffer] = [b""]
    total = 0
    for part in parts:
        n = len(part) if not isinstance(part, memoryview) else part.nbytes
        if n:
            out.append(part)
            total += n
    out[0] = SIZE.pack(total)
    return out

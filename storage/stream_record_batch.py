"""StreamRecordBatch: the unit appended to a stream, byte-compatible with AutoMQ.

======  ==============  =====  =========================================
offset  field           bytes  meaning
======  ==============  =====  =========================================
0       magic           1      ``0x22``
1       streamId        8      stream the batch belongs to
9       epoch           8      stream epoch of the writer
17      baseOffset      8      first stream offset covered
25      count           4      stream offsets covered (Kafka record count)
29      payloadLength   4      bytes of payload that follow
33      payload         n      usually one Kafka record batch
======  ==============  =====  =========================================

All integers are big-endian. A batch covers stream offsets ``[baseOffset, baseOffset+count)``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = 0x22
HEADER = struct.Struct(">bqqqii")
HEADER_SIZE = HEADER.size  # 33

assert HEADER_SIZE == 33


class CorruptRecordError(ValueError):
    """Raised when bytes do not hold a well-formed StreamRecordBatch."""


@dataclass(slots=True, frozen=True)
class StreamRecordBatch:
    stream_id: int
    epoch: int
    base_offset: int
    count: int
    payload: bytes | memoryview

    @property
    def last_offset(self) -> int:
        """The exclusive end offset, ``base_offset + count``."""
        return self.base_offset + self.count

    @property
    def size(self) -> int:
        """Encoded size in bytes, header included."""
        return HEADER_SIZE + len(self.payload)

    def encode(self) -> bytes:
        return encode(self)


def encode_header(batch: StreamRecordBatch) -> bytes:
    return HEADER.pack(
        MAGIC, batch.stream_id, batch.epoch, batch.base_offset, batch.count, len(batch.payload)
    )


def encode(batch: StreamRecordBatch) -> bytes:
    return encode_header(batch) + bytes(batch.payload)


def decode(buf: bytes | memoryview, pos: int = 0) -> tuple[StreamRecordBatch, int]:
    """Decode one batch at ``pos``; return it and the position after it.

    The payload is a zero-copy ``memoryview`` slice of ``buf``.
    """
    view = memoryview(buf)
    if len(view) - pos < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated StreamRecordBatch header at {pos}: {len(view) - pos} < {HEADER_SIZE} bytes"
        )
    magic, stream_id, epoch, base_offset, count, length = HEADER.unpack_from(view, pos)
    if magic != MAGIC:
        raise CorruptRecordError(f"bad StreamRecordBatch magic 0x{magic & 0xFF:02x} at {pos}")
    if length < 0 or count < 0:
        raise CorruptRecordError(f"negative count/length in StreamRecordBatch at {pos}")
    end = pos + HEADER_SIZE + length
    if end > len(view):
        raise CorruptRecordError(
            f"truncated StreamRecordBatch payload at {pos}: needs {length} bytes, "
            f"{len(view) - pos - HEADER_SIZE} left"
        )
    return StreamRecordBatch(
        stream_id, epoch, base_offset, count, view[pos + HEADER_SIZE : end]
    ), end


def decode_all(buf: bytes | memoryview) -> list[StreamRecordBatch]:
    """Decode a run of batches that fills ``buf`` exactly."""
    out: list[StreamRecordBatch] = []
    pos = 0
    while pos < len(buf):
        batch, pos = decode(buf, pos)
        out.append(batch)
    return out

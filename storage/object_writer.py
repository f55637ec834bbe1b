"""ObjectWriter: lays StreamRecordBatches out as one object (pure, no I/O).

Batches are added in (streamId, offset) order. Each stream's batches are cut into data blocks
of about ``block_size`` bytes: a block closes once it reaches the size, when the stream changes,
or when offsets stop being contiguous. ``finish()`` appends the index block and footer and
returns the object as buffers of about ``PART_CHUNK`` bytes, ready for a PUT or a multipart
upload.

Each byte is copied once: blocks keep references to the batches' headers and payloads until
about ``PART_CHUNK`` bytes of closed blocks are joined into one buffer (a join per block and
then one per object would copy every byte twice, and the copy into fresh memory is most of an
upload's CPU time). Chunks, not one buffer per object: a ``join`` holds the GIL for its whole
copy, and the event loop waits for it meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from storage import object_format, stream_record_batch
from storage.object_format import DataBlockIndex, Footer, StreamOffsetRange
from storage.stream_record_batch import StreamRecordBatch

PART_CHUNK = 1 << 20


@dataclass(slots=True, frozen=True)
class BuiltObject:
    """An object's bytes (as buffers) and what it holds."""

    parts: list[bytes]  # the object's bytes in chunks (what ``drain()`` did not take)
    size: int
    index: list[DataBlockIndex]

    @property
    def ranges(self) -> list[StreamOffsetRange]:
        return object_format.stream_ranges(self.index)

    def to_bytes(self) -> bytes:
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


class ObjectWriter:
    def __init__(self, block_size: int) -> None:
        if block_size <= 0:
            raise ValueError(f"block size must be positive, got {block_size}")
        self._block_size = block_size
        self._parts: list[bytes] = []  # closed blocks, joined in chunks
        self._closed: list[bytes | memoryview] = []  # closed blocks' pieces, not yet joined
        self._closed_bytes = 0
        self._index: list[DataBlockIndex] = []
        self._position = 0
        self._block: list[bytes | memoryview] = []
        self._block_bytes = 0
        self._block_stream = -1
        self._block_start = 0
        self._block_end = 0
        self._last: tuple[int, int] | None = None

    def add(self, batch: StreamRecordBatch) -> None:
        key = (batch.stream_id, batch.base_offset)
        if self._last is not None and key < self._last:
            raise ValueError(
                f"batches must come in (stream, offset) order: {key} after {self._last}"
            )
        self._last = key
        if self._block and (
            batch.stream_id != self._block_stream or batch.base_offset != self._block_end
        ):
            self._close_block()
        if not self._block:
            self._block_stream = batch.stream_id
            self._block_start = batch.base_offset
        self._block.append(stream_record_batch.encode_header(batch))
        self._block.append(batch.payload)
        self._block_bytes += batch.size
        self._block_end = batch.last_offset
        if self._block_bytes >= self._block_size:
            self._close_block()

    def add_all(self, batches: Iterable[StreamRecordBatch]) -> None:
        for b in batches:
            self.add(b)

    @property
    def size(self) -> int:
        """Bytes written so far, the open block included."""
        extra = object_format.BLOCK_HEADER_SIZE + self._block_bytes if self._block else 0
        return self._position + extra

    def _close_block(self) -> None:
        count = len(self._block) // 2
        self._closed.append(object_format.encode_block_header(count, self._block_bytes))
        self._closed.extend(self._block)
        self._closed_bytes += object_format.BLOCK_HEADER_SIZE + self._block_bytes
        if self._closed_bytes >= PART_CHUNK:
            self._parts.append(b"".join(self._closed))
            self._closed = []
            self._closed_bytes = 0
        size = object_format.BLOCK_HEADER_SIZE + self._block_bytes
        self._index.append(
            DataBlockIndex(
                stream_id=self._block_stream,
                start_offset=self._block_start,
                end_offset_delta=self._block_end - self._block_start,
                record_count=count,
                start_position=self._position,
                size=size,
            )
        )
        self._position += size
        self._block = []
        self._block_bytes = 0

    def drain(self) -> list[bytes]:
        """Hand over the blocks closed so far (for writers that upload as they go); ``finish``
        then returns only what came after, while its index and size still cover everything."""
        parts = self._parts
        if self._closed:
            parts.append(b"".join(self._closed))
        self._parts, self._closed, self._closed_bytes = [], [], 0
        return parts

    def finish(self) -> BuiltObject:
        if self._block:
            self._close_block()
        index = object_format.encode_index(self._index)
        footer = object_format.encode_footer(Footer(self._position, len(index)))
        parts = [*self._parts, b"".join([*self._closed, index, footer])]
        self._parts, self._closed, self._closed_bytes = [], [], 0
        size = self._position + len(index) + len(footer)
        return BuiltObject(parts=parts, size=size, index=list(self._index))

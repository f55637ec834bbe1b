"""A group commit's batch in the file WAL: the appends taken into it (:class:`Pending`), its
items as laid out in the ring (:class:`Write`), and the bytes that write them.

A batch is written as one vectored write per contiguous run of the ring (:func:`write_runs`),
or copied into one staging buffer for the io_uring (:func:`stage`), and followed by zeros up to
the next page boundary (:func:`page_fill`): a write ending inside a page the kernel does not
hold would first read that page from the disk, one more wait per commit.
"""

from __future__ import annotations

import asyncio
import itertools
import mmap
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from storage.wal import record
from storage.wal.header import HEADER_AREA_SIZE
from storage.wal.interface import WALAppendResult
from storage.wal.record import Buffer
from storage.wal.ring_file import ZEROS_VIEW, lap_end

PAGE_SIZE = mmap.PAGESIZE  # the page cache's unit: a write ending inside a page reads it first


@dataclass(slots=True)
class Pending:
    """An append queued for the next commit."""

    parts: list[Buffer]
    size: int  # the record's, header included
    future: asyncio.Future[WALAppendResult]
    on_done: Callable[[asyncio.Future[WALAppendResult]], object] | None
    submitted: float  # time.perf_counter() at submit, for the append-wait figures
    taken: float = 0.0  # ... when the writer took it into a batch


# An append taken into a batch: the append, and the logical offsets its record starts and ends at
Acked = tuple[Pending, int, int]


@dataclass(slots=True, frozen=True)
class Write:
    """One item of a batch as laid out in the ring: a record, or padding up to ``lap_end``."""

    offset: int
    size: int
    parts: list[Buffer] | None  # None: padding
    lap_end: int = 0


def page_fill(end: int, capacity: int, trim: int) -> int:
    """How many zero bytes to write after a batch ending at logical offset ``end`` so that the
    write ends on a page boundary. The next commit starts in this page, which the write left
    cached. Never past the lap end, nor over the oldest live byte (``trim`` + ``capacity``);
    zeros past the log end read as its end, as the free ring does."""
    fill = -(HEADER_AREA_SIZE + end % capacity) % PAGE_SIZE
    stop = min(end + fill, lap_end(end, capacity), trim + capacity)
    return max(0, stop - end)


def write_runs(writes: Sequence[Write], capacity: int, fill: int) -> list[tuple[int, list[Buffer]]]:
    """The batch's encoded bytes as ``(file position, buffers)``, one per contiguous run of the
    ring, the last followed by ``fill`` zeros unless it is padding."""
    runs: list[tuple[int, list[Buffer]]] = []
    contiguous_at = -1
    for write in writes:
        position = HEADER_AREA_SIZE + write.offset % capacity
        if write.parts is None:
            buffers: list[Buffer] = [record.encode_padding(write.offset, write.lap_end)]
        else:
            buffers = record.encode(write.offset, write.parts)
        if position == contiguous_at:
            runs[-1][1].extend(buffers)
        else:
            runs.append((position, buffers))
        # Padding is followed by a jump to the ring start, never by contiguous bytes.
        contiguous_at = -1 if write.parts is None else position + write.size
    if fill and writes[-1].parts is not None:
        runs[-1][1].append(ZEROS_VIEW[:fill])
    return runs


def is_one_run(writes: Sequence[Write]) -> bool:
    """Whether the batch is one contiguous run of records: no padding in it, and no jump to
    the next lap (taken without padding when fewer than 24 bytes were left)."""
    if any(write.parts is None for write in writes):
        return False
    return all(b.offset == a.offset + a.size for a, b in itertools.pairwise(writes))


def stage(staging: mmap.mmap, writes: Sequence[Write], fill: int) -> int:
    """Copy a batch that is one run (:func:`is_one_run`) encoded, and ``fill`` zeros after it,
    to the start of ``staging``; returns the bytes copied, -1 if they do not fit."""
    length = writes[-1].offset + writes[-1].size - writes[0].offset + fill
    if length > len(staging):
        return -1
    at = 0
    for write in writes:
        for part in record.encode(write.offset, write.parts or ()):
            view = memoryview(part).cast("B")
            staging[at : at + len(view)] = view
            at += len(view)
    staging[at : at + fill] = ZEROS_VIEW[:fill]
    return length

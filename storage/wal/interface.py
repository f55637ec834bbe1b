"""What S3Storage needs of a write-ahead log (``FileWAL`` and ``ObjectWAL`` both provide it), and
the records, results and counters they hand back."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

Body = bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]


@dataclass(slots=True, frozen=True)
class WALRecord:
    """A record returned by recovery: its logical offset, the offset after it, and its body."""

    offset: int
    next_offset: int
    body: memoryview | bytes


@dataclass(slots=True, frozen=True)
class WALAppendResult:
    """Where an acknowledged (fsynced) record lies: ``[offset, next_offset)``."""

    offset: int
    next_offset: int


def spread(times: Sequence[float]) -> str:
    """p50, p99 and max of latency samples in seconds, as the WALs' timing summaries give
    them (``times`` not empty)."""
    ordered = sorted(times)
    p50, p99 = (ordered[min(len(ordered) - 1, int(p * len(ordered)))] for p in (0.5, 0.99))
    return f"p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms, max {ordered[-1] * 1e3:.1f} ms"


@dataclass(slots=True, frozen=True)
class WALStats:
    """Counters since open: acknowledged appends, data fsyncs (one per batch), record bytes
    written (headers and padding included) and header writes (each with its own fsync)."""

    appends: int
    fsyncs: int
    bytes: int
    header_writes: int


class WriteAheadLog(Protocol):
    """A log of records at growing logical offsets, durable before they are acknowledged,
    acknowledged in offset order, replayed from the trim point by ``recover()``."""

    @property
    def path(self) -> str:
        """Where the log lives (a file, or an object store prefix), for messages."""
        ...

    @property
    def capacity(self) -> int:
        """Most bytes of records between the trim point and the end of the log."""
        ...

    @property
    def free_space(self) -> int:
        """Capacity neither live nor promised to appends in flight; at or below zero appends
        should wait for ``trim()``."""
        ...

    @property
    def next_offset(self) -> int:
        """The end of the acknowledged log."""
        ...

    @property
    def trim_offset(self) -> int:
        """Recovery starts here."""
        ...

    @property
    def stats(self) -> WALStats: ...

    # called after each group of acknowledgements, once every ``on_done`` of it has run: what
    # they started (responses to write) can be finished together
    after_acknowledgements: list[Callable[[], object]]

    def latency_samples(self) -> dict[str, Sequence[float]]:
        """Recent latency samples (seconds) by kind: ``append``, ``sync`` (and others)."""
        ...

    def timing_summary(self) -> str: ...

    def recover(self) -> Iterator[WALRecord]:
        """Every record from the trim point on, in order; consumed once, before appends."""
        ...

    def submit(
        self,
        body: Body,
        on_done: Callable[[asyncio.Future[WALAppendResult]], object] | None = None,
    ) -> asyncio.Future[WALAppendResult]:
        """Queue one record; the future (and ``on_done``) completes once it and every record
        before it are durable."""
        ...

    async def append(self, body: Body) -> WALAppendResult: ...

    def acknowledge_completed(self) -> None:
        """Acknowledge now the commits that became durable since the event loop last looked,
        if this log learns of them from the loop (the caller is about to handle more requests
        before the loop's next pass)."""
        ...

    def commit_now(self) -> None:
        """The caller has no more appends to submit for now: commit what is queued, if this log
        commits on the event loop, rather than at the loop's next pass (after whatever else
        is ready), where the requests read meanwhile would wait behind the write."""
        ...

    async def trim(self, offset: int) -> None:
        """Records before ``offset`` are in object storage: recovery need not replay them."""
        ...

    async def close(self, *, clean: bool = True) -> None: ...

"""The file WAL's asynchronous commits: its event loop's writes through an io_uring.

Where the kernel offers io_uring (``storage.wal.uring``), the loop does not wait for its commits
at all. It copies the batch, and the zeros up to its page's end, into a staging buffer, submits
it as one write of the same ``O_DSYNC`` descriptor, and goes on serving; when the write
completes (the kernel's worker made it, durable) the loop acknowledges the batch and commits at
once what queued meanwhile (up to ``ASYNC_COMMIT_MAX`` bytes). A disk that holds a write then
delays acknowledgements, never the loop, and no Python thread hands results back.

What is submitted while a write is in flight goes out as one more write queued behind it
(``ASYNC_IN_FLIGHT`` in all), which the kernel starts as soon as the one before it completes,
not a pass of the loop later: a client's burst (librdkafka sends a Produce request per
partition) is written as its requests are read, the later ones no longer waiting for the first
one's write to be acknowledged before their own is even submitted. The writes land in order
(``IOSQE_IO_DRAIN``), each starting where the one before it ended, and are acknowledged in
order. The kernel's workers that make them run at real-time priority where the process may set
it (``storage.wal.iowq``).

Once a second (``RING_CHECK_S``) the loop also looks for a completion the eventfd did not
announce, one still unreaped ``RING_RECHECK_S`` after the check found it (a check may run in
the loop's pass before the one that reads the eventfd): left unreaped, it would hold every
commit after it, and the writer thread's header writes (a WAL's trim), for good.

:class:`AsyncCommits` keeps the writes in flight and matches completions to them; which batches
go to the ring, the commit lock and the acknowledgements are the WAL's
(``storage.wal.file_wal``).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from storage.wal import batch as wal_batch
from storage.wal.batch import PAGE_SIZE, Acked, Write
from storage.wal.header import HEADER_AREA_SIZE
from storage.wal.iowq import WorkerPriority
from storage.wal.uring import RingWriter, open_ring

logger = logging.getLogger("storage.wal.file_wal")

# Most bytes one asynchronous commit writes; larger batches go to the writer thread.
ASYNC_COMMIT_MAX = 4 * 1024 * 1024
# Asynchronous commits in flight at once: one being written, one queued behind it in the kernel
# (a batch that would end past the window from the last durable byte waits for them).
ASYNC_IN_FLIGHT = 2
# How often the loop looks for completed asynchronous commits nobody announced
RING_CHECK_S = 1.0
RING_RECHECK_S = 0.05  # a completion the check found is acknowledged if still unreaped then
# a completion this long after the one before may have come from a worker the kernel made
# meanwhile, at normal priority (``storage.wal.iowq``): look for it at once
IOWQ_IDLE_S = 2.0


@dataclass(slots=True)
class RingBatch:
    """An asynchronous commit in flight: its appends, the bytes it writes, the staging buffer
    they are in, when it was submitted, and whether another was in flight then."""

    acked: list[Acked]
    length: int
    buffer: int
    started: float
    behind: bool
    result: int | None = None  # once completed: bytes written, or a negative errno


class AsyncCommits:
    """The commits submitted to one io_uring and not yet acknowledged, oldest first
    (``batches``). ``on_completion`` runs on the event loop when the eventfd says writes have
    completed, and when the once-a-second check finds completions it did not announce."""

    def __init__(
        self,
        writer: RingWriter,
        path: str,
        capacity: int,
        on_completion: Callable[[], object],
        *,
        realtime_io: bool,
    ) -> None:
        self.writer = writer
        self.batches: collections.deque[RingBatch] = collections.deque()
        # the ring's workers at real-time priority (None: not asked for)
        self.iowq = WorkerPriority() if realtime_io else None
        self._path = path
        self._capacity = capacity
        self._on_completion = on_completion
        self._loop = asyncio.get_running_loop()
        self._done_at = 0.0  # time.perf_counter() of the last completion
        self._closed = False
        self._loop.add_reader(writer.eventfd, on_completion)
        self._check: asyncio.TimerHandle | None = self._loop.call_later(
            RING_CHECK_S, self._check_ring
        )

    @classmethod
    def open(
        cls,
        fd: int,
        path: str,
        capacity: int,
        on_completion: Callable[[], object],
        *,
        realtime_io: bool,
    ) -> AsyncCommits | None:
        """Commits through an io_uring writing ``fd``, or None where the kernel offers none
        (the WAL's loop then writes its commits itself). ``realtime_io``: its workers at
        real-time priority."""
        writer, why = open_ring(fd, ASYNC_COMMIT_MAX + PAGE_SIZE, ASYNC_IN_FLIGHT)
        if writer is None:
            logger.info("WAL %s: commits are written on the event loop: %s", path, why)
            return None
        logger.debug("WAL %s: the event loop's commits are written by an io_uring", path)
        return cls(writer, path, capacity, on_completion, realtime_io=realtime_io)

    @property
    def full(self) -> bool:
        """Every staging buffer has a write in flight."""
        return len(self.batches) >= len(self.writer.staging)

    def completed(self) -> bool:
        """Whether a write in flight has completed and waits to be reaped."""
        return bool(self.batches) and self.writer.completed()

    def submit(self, acked: list[Acked], writes: Sequence[Write], fill: int) -> bool:
        """Copy one batch, and ``fill`` zeros after it, into a free staging buffer and submit it
        as one write, behind those in flight. False: not so (the batch is not one contiguous
        run of the ring, does not fit a buffer, or the kernel refused it with others in flight);
        the caller writes it on the loop, or puts it back while others are in flight. Raises
        OSError when the kernel refuses it with none in flight."""
        if not wal_batch.is_one_run(writes):
            return False
        used = {batch.buffer for batch in self.batches}
        buffer = next(i for i in range(len(self.writer.staging)) if i not in used)
        length = wal_batch.stage(self.writer.staging[buffer], writes, fill)
        if length < 0:
            return False
        started = time.perf_counter()
        behind = bool(self.batches)
        try:
            self.writer.submit(
                buffer,
                HEADER_AREA_SIZE + writes[0].offset % self._capacity,
                length,
                after_others=behind,
            )
        except OSError:
            if behind:  # tried again once those in flight are done
                return False
            raise
        self.batches.append(RingBatch(acked, length, buffer, started, behind))
        return True

    def reap(self) -> float | None:
        """Give each batch whose write completed since the last call its result; returns when
        (``time.perf_counter()``), None if none had. The caller acknowledges the completed
        batches at the head of ``batches``, in order."""
        completed = self.writer.reap()
        if not completed:
            return None
        for buffer, result in completed:
            for batch in self.batches:
                if batch.buffer == buffer and batch.result is None:
                    batch.result = result
                    break
        now = time.perf_counter()
        if self.iowq is not None and now - self._done_at >= IOWQ_IDLE_S:
            self._loop.call_soon(self.iowq.raise_new)
        self._done_at = now
        return now

    def _check_ring(self) -> None:
        """Every ``RING_CHECK_S``: have writes in flight that completed without the eventfd
        saying so acknowledged. The appends behind a completion nobody reaps would wait for
        it forever, and so would the writer thread, for the commit lock."""
        if self._closed:
            return
        if self.completed():
            # seen again a moment later, none reaped meanwhile: this check may have run in
            # the loop's pass before the one that reads the eventfd
            self._loop.call_later(RING_RECHECK_S, self._check_unreaped, self.writer.reaped())
        if self.iowq is not None:
            self.iowq.raise_new()
        self._check = self._loop.call_later(RING_CHECK_S, self._check_ring)

    def _check_unreaped(self, reaped: int) -> None:
        """A completion waited at the last check when ``reaped`` completions had been reaped:
        acknowledge it if none has been since (its eventfd announced nothing)."""
        if self._closed or self.writer.reaped() != reaped or not self.completed():
            return
        logger.warning(
            "WAL %s: an io_uring write had completed unannounced; acknowledged now", self._path
        )
        self._on_completion()

    def stop_checking(self) -> None:
        """No more checks (the WAL is closing)."""
        self._closed = True
        if self._check is not None:
            self._check.cancel()
            self._check = None

    def close(self) -> None:
        """Release the ring; no write may be in flight."""
        self.stop_checking()
        self._loop.remove_reader(self.writer.eventfd)
        self.writer.close()

"""A durable write-ahead log in one preallocated file, written as a ring, with group commit.

File layout::

    [0, 8192)                    two header copies, 4 KiB slots (``storage.wal.header``)
    [8192, 8192 + capacity)      the ring of records (``storage.wal.record``)

Logical offsets grow forever; the record at logical offset ``o`` starts at file position
``8192 + o % capacity``. Records never wrap: when one does not fit before the end of the lap the
rest of the lap is skipped (with a padding header when at least 24 bytes are left), so the
record starts at the next multiple of ``capacity``; the skipped bytes count in the offsets.

The live log is ``[trim_offset, next_offset)``. A write never overwrites a byte at or after the
trim offset: an append that would waits until ``trim()`` frees space. Each record header
carries its own logical offset, so a record left over from an earlier lap (at the same file
position, but ``capacity`` or more bytes lower) is rejected on read.

Group commit: ``append()`` queues the record and waits; one writer thread takes everything that
queued up while its previous write ran and writes it with one ``pwritev``. The file is open with
``O_DSYNC``, so the write returns once the data is durable (as ``fdatasync`` after it would
make it, for one system call and one hand-back of the GIL less per commit); the thread then
hands the results to the event loop, which acknowledges the records in offset order. The
thread also serves the header writes. A batch's bytes are its records, the padding at a lap's
end, and zeros up to the next page boundary, so that no write reads a page from the disk first
(``storage.wal.batch``); the file is created, opened and read back by ``storage.wal.ring_file``.

Inline commits: when the writer thread is idle, the appends submitted in one pass of the event
loop (up to ``INLINE_COMMIT_MAX`` bytes) are written by the loop itself, at the start of its
next pass, and acknowledged right after: a small durable write (~0.15 ms here) costs less than
handing it over, since the thread must be woken, wait for a core and for the GIL after its
write, and hand the results back through the loop (together ~0.5 ms of every acknowledgement
at 20 MB/s on two cores). Whoever commits holds ``_commit_lock``: the thread takes larger
batches, the ones queued while it or the loop writes, and the header writes. A write on the
loop that the disk held for ``INLINE_STALL_S`` or more, or ``INLINE_SLOW_RUN`` writes in a row
of ``INLINE_SLOW_S`` or more, send the commits of the next ``INLINE_PAUSE_S`` to the thread:
there a stalled or busy disk delays acknowledgements, not the loop. A lone slow write does not:
beside a busy neighbour (an S3 server on the same cores) they come a few times a second, and
the thread's hand-backs under that contention cost more than the write.

Asynchronous commits: where the kernel offers io_uring, the loop does not wait for its commits
at all. It submits each batch as one write of the same ``O_DSYNC`` descriptor, one more queued
behind one in flight, and acknowledges a batch when the eventfd says its write completed
(``storage.wal.async_commits``). The ring's writes hold ``_commit_lock`` like any commit, from
the first submitted to the last completed; the writer thread still takes larger batches, those
with padding in them, and the header writes.

Torn tails: at most ``window`` bytes (kept in the header) are ever written past the last
fsync. After a crash, recovery stops at the first invalid record and zeroes the next ``window``
bytes of free ring, so records that a crashed run wrote past the cut can never line up with the
records appended after it and reappear on a later recovery.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from storage.wal import async_commits, record, ring_file
from storage.wal import batch as wal_batch
from storage.wal import header as wal_header
from storage.wal.async_commits import AsyncCommits
from storage.wal.batch import Acked, Pending, Write
from storage.wal.errors import WALError
from storage.wal.header import WALHeader
from storage.wal.interface import WALAppendResult, WALRecord, WALStats, spread
from storage.wal.iowq import WorkerPriority
from storage.wal.record import HEADER_SIZE
from storage.wal.ring_file import pwrite_all

logger = logging.getLogger(__name__)
# each durable write that took DEBUG_SLOW_WRITE_S or more, as it completes, at DEBUG
# (log.level.automq.wal=DEBUG; the benches count them inside the window they measure), and
# from SLOW_WRITE_S on at WARNING: every acks=all append in it waited as long
slow_writes = logging.getLogger("automq.wal")
DEBUG_SLOW_WRITE_S = 0.01
SLOW_WRITE_S = 1.0

MIN_CAPACITY = 4096
# Most bytes one batch may write past the last fsync. Larger batches amortise the fsync better;
# the cost is that recovery after a crash zeroes this much of the free ring.
DEFAULT_WINDOW = 8 * 1024 * 1024
_WINDOW_GRANULE = 1024 * 1024
_TIMINGS_KEPT = 100_000  # the latest group commits whose write times are kept
# Most bytes the event loop writes itself in one commit; larger batches go to the writer thread
# (a saturating producer's megabyte batches would hold the loop for milliseconds).
INLINE_COMMIT_MAX = 256 * 1024
# An inline write that took INLINE_STALL_S (the disk stalled), or INLINE_SLOW_RUN in a row that
# took INLINE_SLOW_S (the disk is busy), held the event loop with them; the next commits go to
# the writer thread for INLINE_PAUSE_S, as a slow disk's stalls come in runs.
INLINE_STALL_S = 0.02
INLINE_SLOW_S = 0.005
INLINE_SLOW_RUN = 2
INLINE_PAUSE_S = 1.0


@dataclass(slots=True)
class _HeaderRequest:
    trim_offset: int | None
    window: int | None
    shutdown_clean: bool
    future: asyncio.Future[None]


class FileWAL:
    """The write-ahead log in one file; see the module docstring for the layout.

    Use: ``wal = await FileWAL.open(...)``; consume ``wal.recover()`` (replay what it yields);
    then ``append()`` concurrently, ``trim()`` once data is uploaded, and ``close()``.
    """

    def __init__(self, path: str, fd: int, header: WALHeader, *, created: bool) -> None:
        self._path = path
        self._fd = fd
        self._header = header
        self._capacity = header.capacity
        self._trim = header.trim_offset
        self._next = header.trim_offset
        self._window = header.window
        # What the previous run left behind, for recovery to judge the tail by.
        self._previous_clean = header.shutdown_clean
        self._previous_flushed = header.flushed_offset
        self._previous_window = header.window
        # A new file has nothing to recover; an existing one must be recovered first so appends
        # continue exactly where the valid log ends.
        self._recovered = created
        self._started = False
        self._loop = asyncio.get_running_loop()
        # Shared with the writer thread, under _cond: appends and header writes queued for it.
        self._cond = threading.Condition()
        self._queue: collections.deque[Pending] = collections.deque()
        self._header_requests: collections.deque[_HeaderRequest] = collections.deque()
        self._writer_idle = False  # waiting for work: the next submit wakes it
        # held while a batch is planned and written, or the header written: by the writer
        # thread, or by the event loop for an inline commit
        self._commit_lock = threading.Lock()
        self._inline_max = INLINE_COMMIT_MAX  # 0: every commit by the writer thread
        self._inline_scheduled = False  # an inline commit is due at the loop's next pass
        self._inline_commits = 0
        self._inline_paused_until = 0.0  # time.monotonic(): commits go to the thread until
        self._inline_slow_run = 0  # inline writes in a row that took INLINE_SLOW_S or more
        # the event loop's asynchronous commits (None: no io_uring here, or no longer)
        self._async: AsyncCommits | None = None
        self._async_commits = 0  # acknowledged
        # see WriteAheadLog.after_acknowledgements
        self.after_acknowledgements: list[Callable[[], object]] = []
        self._writer_done = False  # it has taken its last request
        self._unwritten = 0  # bytes of records submitted and not yet written (or failed)
        self._thread: threading.Thread | None = None
        self._exited: asyncio.Future[None] = self._loop.create_future()
        self._failed: WALError | None = None
        self._failure_logged = False
        self._closing = False
        self._clean_close = True
        self._closed = False
        self._appends = 0
        self._fsyncs = 0
        self._bytes = 0
        self._header_writes = 0
        # seconds each recent group commit spent in its durable pwritev (logged at close)
        self._write_times: collections.deque[float] = collections.deque(maxlen=_TIMINGS_KEPT)
        # seconds each recent append waited: from submit until the writer took it, and until
        # its acknowledgement ran on the event loop
        self._queued_times: collections.deque[float] = collections.deque(maxlen=_TIMINGS_KEPT)
        self._wait_times: collections.deque[float] = collections.deque(maxlen=_TIMINGS_KEPT)

    @classmethod
    async def open(
        cls,
        path: str,
        capacity: int,
        *,
        node_id: int = 0,
        init_zero: bool = False,
        inline_commit_max: int = INLINE_COMMIT_MAX,
        use_io_uring: bool = True,
        realtime_io: bool = True,
    ) -> FileWAL:
        """Open the WAL at ``path``, creating and preallocating it if it does not exist.

        ``capacity`` is the ring size in bytes (``s3.wal.capacity``); it must match an existing
        file's. A file owned by another node id, or open in another process, is refused.
        ``init_zero`` (``s3.wal.init.zero``): a new file's blocks are written with zeros, not
        only allocated (see ``ring_file.write_zeros``). ``inline_commit_max``: the most bytes
        the event loop commits itself (0: the writer thread makes every commit).
        ``use_io_uring``: the event loop submits its commits to an io_uring where the kernel
        allows (else, or False, it writes them itself). ``realtime_io``
        (``s3.wal.io.realtime``): the io_uring's kernel workers, which make those writes, run
        at real-time priority where the process may set it (``storage.wal.iowq``).
        """
        if capacity < MIN_CAPACITY:
            raise WALError(f"s3.wal.capacity must be at least {MIN_CAPACITY} bytes, got {capacity}")
        fd, found, created = await ring_file.open_file(
            path, capacity, node_id, DEFAULT_WINDOW, init_zero
        )
        try:
            wal = cls(path, fd, found, created=created)
            wal._inline_max = inline_commit_max
            # Mark the log unclean before anything is written, so a crash from here on is
            # recognised as one on the next open.
            await asyncio.to_thread(
                wal._write_header_now,
                shutdown_clean=False,
                window=max(found.window, DEFAULT_WINDOW),
            )
        except BaseException:
            os.close(fd)
            raise
        if use_io_uring and inline_commit_max > 0:
            wal._async = AsyncCommits.open(
                fd, path, capacity, wal._ring_done, realtime_io=realtime_io
            )
        wal._thread = threading.Thread(
            target=wal._writer_main, name=f"wal-writer:{os.path.basename(path)}", daemon=True
        )
        wal._thread.start()
        return wal

    @property
    def path(self) -> str:
        return self._path

    @property
    def io_priority(self) -> WorkerPriority | None:
        """The io_uring workers' real-time priority (how many were raised, or why it was
        refused); None without an io_uring or with ``realtime_io`` off."""
        return self._async.iowq if self._async is not None else None

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def trim_offset(self) -> int:
        """Everything before this offset may be overwritten; recovery starts here."""
        return self._trim

    @property
    def next_offset(self) -> int:
        """The end of the durable log (meaningful once recovery has run)."""
        return self._next

    @property
    def free_space(self) -> int:
        """Ring bytes neither live nor promised to a record waiting to be written; at or below
        zero, the next record waits for ``trim()`` (padding at a lap end is not counted)."""
        return self._trim + self._capacity - self._next - self._unwritten

    @property
    def stats(self) -> WALStats:
        return WALStats(self._appends, self._fsyncs, self._bytes, self._header_writes)

    def latency_samples(self) -> dict[str, Sequence[float]]:
        """The recent samples (seconds, oldest first; not copies) of each WAL latency:
        ``append`` (submitted to acknowledged), ``queue`` (to taken by the writer) and
        ``sync`` (a group commit's O_DSYNC write: the fsync; not one queued behind another in
        the io_uring, whose time would include the wait for that one)."""
        return {
            "append": self._wait_times,
            "queue": self._queued_times,
            "sync": self._write_times,
        }

    def timing_summary(self) -> str:
        """p50, p99 and max of the recent group commits' durable write times, and of the recent
        appends' waits: until the writer took them, and until acknowledged."""
        if not self._write_times:
            return "no group commits"

        return (
            f"{self._fsyncs} group commits ({self._inline_commits} on the event loop"
            f"{f', {self._async_commits} of them asynchronous' if self._async_commits else ''}): "
            f"O_DSYNC write {spread(self._write_times)}"
            f"{' (those not queued behind another)' if self._async_commits else ''};"
            f" {len(self._wait_times)} appends: queued {spread(self._queued_times)},"
            f" acknowledged {spread(self._wait_times)}"
        )

    # --- recovery -----------------------------------------------------------------------

    def recover(self) -> Iterator[WALRecord]:
        """Yield every valid record from the trim offset on, in order (``ring_file.scan``):
        the log ends, and appends continue, at the first invalid one. Must be consumed fully
        before the first ``append``. Reads synchronously; bodies are views into read chunks.
        """
        self._check_open()
        if self._started:
            raise WALError("recover() must run before the first append")
        end = yield from ring_file.scan(self._fd, self._trim, self._capacity)
        self._finish_recovery(end)

    def _finish_recovery(self, scanned: ring_file.ScanEnd) -> None:
        end, cut, count = scanned.offset, scanned.cut, scanned.records
        self._next = end
        self._recovered = True
        if self._previous_clean and end == self._previous_flushed:
            logger.info(
                "WAL %s: recovered %d records in [%d, %d) after a clean shutdown",
                self._path,
                count,
                self._trim,
                end,
            )
            return
        # After a crash, or a clean log whose end went missing, bytes a previous run wrote past
        # `end` may still hold records with matching offsets; zero them before appending.
        wipe_end = min(
            max(end, self._previous_flushed) + self._previous_window, self._trim + self._capacity
        )
        try:
            # (once, at startup: inline rather than in a thread)
            ring_file.zero_range(self._fd, end, wipe_end, self._capacity)
        except OSError as exc:
            failure = WALError(f"WAL {self._path}: zeroing the tail after recovery failed: {exc}")
            self._enter_failed(failure)
            raise failure from exc
        if cut is not None and not scanned.normal_end:
            why = f"{cut.reason} ({cut})"
        elif self._previous_clean:
            why = f"the clean shutdown recorded the end at {self._previous_flushed}"
        else:
            why = None
        if why is None:
            logger.info(
                "WAL %s: recovered %d records in [%d, %d) after an unclean shutdown; zeroed %d"
                " bytes after the end",
                self._path,
                count,
                self._trim,
                end,
                wipe_end - end,
            )
        else:
            logger.warning(
                "WAL %s: recovery cut the log at offset %d: %s; %d bytes from there on"
                " discarded (zeroed); %d records recovered from offset %d",
                self._path,
                end,
                why,
                wipe_end - end,
                count,
                self._trim,
            )

    # --- appends --------------------------------------------------------------------------

    async def append(
        self, body: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview]
    ) -> WALAppendResult:
        """Append one record (``body`` or the concatenation of its parts); returns once it is
        fsynced. Waits while the ring is full until ``trim()`` frees space.

        The buffers are written as given, not copied: do not mutate them until this returns.
        Raises ``WALError`` when the record can never fit, or the WAL is closed or failed.
        """
        # Cancelling the caller cancels the future: a record not yet taken into a batch is then
        # dropped; one already being written still lands in the log, unacknowledged.
        return await self.submit(body)

    def submit(
        self,
        body: bytes | bytearray | memoryview | Sequence[bytes | bytearray | memoryview],
        on_done: Callable[[asyncio.Future[WALAppendResult]], object] | None = None,
    ) -> asyncio.Future[WALAppendResult]:
        """Queue one record now and return the future of its durable append (as ``append``).

        Records are queued in call order. Without a coroutine per record this is the cheap
        path for callers that chain completion callbacks. ``on_done(future)`` is called as
        soon as the future is done, in the same pass of the event loop (a done callback would
        run one pass later), unless the caller cancelled the future.
        """
        self._check_open()
        if not self._recovered:
            raise WALError("consume recover() before the first append")
        if self._closing:
            raise WALError(f"WAL {self._path} is closing")
        parts = [body] if isinstance(body, bytes | bytearray | memoryview) else list(body)
        length = sum(memoryview(part).nbytes for part in parts)
        size = record.record_size(length)
        if size > self._capacity:
            raise WALError(
                f"record of {size} bytes (header included) is larger than"
                f" the WAL capacity {self._capacity} (s3.wal.capacity)"
            )
        self._started = True
        future: asyncio.Future[WALAppendResult] = self._loop.create_future()
        self._unwritten += size
        with self._cond:
            self._queue.append(Pending(parts, size, future, on_done, time.perf_counter()))
            if self._writer_idle:
                if self._inline_max > 0:
                    self._schedule_inline()  # what else this pass submits joins the commit
                else:
                    self._cond.notify()
        return future

    def acknowledge_completed(self) -> None:
        """Acknowledge the io_uring writes that completed since the event loop last looked,
        now rather than at its next pass, which reads the eventfd: the caller is a connection
        between two of the requests it read together, which would otherwise hold the responses
        those writes made ready until it had handled them all. What queued meanwhile waits for
        ``commit_now``, called once the connection has handled them, so the requests read
        together still go out as one write."""
        if self._async is not None and self._async.completed():
            self._ring_done(commit_queued=False)

    def _schedule_inline(self) -> None:
        """Have the queued appends committed on the event loop at its next pass at the latest
        (``commit_now`` makes it sooner)."""
        if not self._inline_scheduled:
            self._inline_scheduled = True
            self._loop.call_soon(self._commit_inline)

    def commit_now(self) -> None:
        """Make the inline commit due at the loop's next pass now: the caller (a connection
        about to wait for its next request) has nothing more to add to it. A write in flight
        that has completed meanwhile is acknowledged first, not a pass later when the loop
        reads its eventfd: what queued behind it then goes out in this commit."""
        if self._async is not None and self._async.completed():
            self._ring_done()
        if self._inline_scheduled:
            self._commit_inline()

    def _commit_inline(self) -> None:
        """On the event loop, a pass after the first append the idle writer did not take:
        write what is queued here and acknowledge it, or hand it to the writer thread when
        it is large, near the ring's end, or the thread has work of its own. With
        asynchronous commits in flight, submit it behind them (``_submit_behind``)."""
        self._inline_scheduled = False
        if not self._queue:
            return
        if self._async is not None and self._async.batches:
            self._submit_behind()
            return
        size = sum(pending.size for pending in self._queue)
        ring = self._async is not None
        if not (self._loop_may_commit(size) and self._commit_lock.acquire(blocking=False)):
            with self._cond:
                self._cond.notify()
            return
        in_flight = False
        try:
            planned = None if self._writer_has_work() else self._plan_batch(blocking=False)
            if planned is not None and planned[0] and ring:
                in_flight = self._submit_to_ring(*planned)
                if in_flight:
                    return  # the lock stays held until _ring_done
                if size > self._inline_max:  # too large to write on the loop: the thread's
                    with self._cond:
                        self._queue.extendleft(pending for pending, _, _ in reversed(planned[0]))
                    planned = None
            if planned is not None and planned[0]:
                self._inline_commits += 1
                writes = self._fsyncs
                self._commit(*planned, inline=True)
                held = self._write_times[-1] if self._fsyncs > writes else 0.0
                self._inline_slow_run = self._inline_slow_run + 1 if held >= INLINE_SLOW_S else 0
                if held >= INLINE_STALL_S or self._inline_slow_run >= INLINE_SLOW_RUN:
                    self._inline_slow_run = 0
                    self._inline_paused_until = time.monotonic() + INLINE_PAUSE_S
                    logger.debug(
                        "WAL %s: a commit held the event loop for %.1f ms; the writer thread "
                        "makes the commits of the next %.0f s",
                        self._path,
                        held * 1000,
                        INLINE_PAUSE_S,
                    )
        finally:
            if not in_flight:
                self._commit_lock.release()
        if self._queue:
            with self._cond:
                self._cond.notify()

    def _loop_may_commit(self, size: int) -> bool:
        """Whether the event loop may commit ``size`` bytes of queued appends itself: not
        larger than its kind of commit takes (through the io_uring, or written on the loop
        while no slow write paused that), the WAL neither failed nor closing, and room enough
        left in the ring that the commit never waits for a trim."""
        if self._async is not None:
            fits = size <= async_commits.ASYNC_COMMIT_MAX
        else:
            fits = size <= self._inline_max and time.monotonic() >= self._inline_paused_until
        return (
            fits
            and self._failed is None
            and not self._closing
            and self.free_space > size + self._inline_max
        )

    def _writer_has_work(self) -> bool:
        """The writer thread is busy or has header writes waiting: the loop leaves it the
        queued appends, which then go in order behind its work."""
        with self._cond:
            return not self._writer_idle or bool(self._header_requests)

    # --- asynchronous commits -------------------------------------------------------------

    def _stop_ring(self) -> None:
        commits, self._async = self._async, None
        if commits is not None:
            commits.close()

    def _submit_to_ring(self, acked: list[Acked], writes: list[Write]) -> bool:
        """Under the commit lock, on the event loop: submit one batch as one write, behind
        those in flight. False: not so (``AsyncCommits.submit``); the caller writes it on the
        loop, or puts it back while others are in flight."""
        commits = self._async
        if commits is None:
            return False
        try:
            return commits.submit(acked, writes, self._page_fill(acked[-1][2]))
        except OSError as exc:
            logger.warning(
                "WAL %s: the io_uring refused a write (%s); commits are written on the event "
                "loop from now on",
                self._path,
                exc,
            )
            self._stop_ring()
            return False

    def _submit_behind(self) -> None:
        """On the event loop, with asynchronous commits in flight (the commit lock held for
        them): submit what queued as one more, unless enough are in flight, the writer thread
        has work waiting for the lock, or the batch is not the ring's to write (too large,
        padding in it, past the window): then it waits for those in flight."""
        if self._async is None or self._async.full:
            return
        size = sum(pending.size for pending in self._queue)
        if not self._loop_may_commit(size) or self._writer_has_work():
            return
        planned = self._plan_batch(blocking=False)
        if planned is not None and planned[0] and not self._submit_to_ring(*planned):
            with self._cond:
                self._queue.extendleft(pending for pending, _, _ in reversed(planned[0]))

    def _ring_done(self, *, commit_queued: bool = True) -> None:
        """On the event loop, when the eventfd says writes in flight have completed:
        acknowledge their batches in order, then commit what queued meanwhile: now, or
        (not ``commit_queued``) at the loop's next pass or ``commit_now``, whichever is first."""
        commits = self._async
        if commits is None:
            return
        now = commits.reap()
        if now is None:
            return
        in_flight = commits.batches
        while in_flight and in_flight[0].result is not None:
            batch = in_flight.popleft()
            failure = self._failed
            if failure is None and batch.result != batch.length:
                result = batch.result or 0
                reason = (
                    os.strerror(-result)
                    if result < 0
                    else f"{result} of {batch.length} bytes written"
                )
                # failed before the lock is let go: the writer thread must not plan from here
                self._fail_batch(batch.acked, reason, None, on_loop=True)
                if not in_flight:
                    self._commit_lock.release()
                continue
            if failure is None:
                if not batch.behind:  # (one queued behind another waited for it, too)
                    self._timed(now - batch.started, batch.length)
                # the log's end moves past it before the writer thread may take the lock
                self._count_commit(batch.acked, batch.acked[-1][2] - batch.acked[0][1])
                self._inline_commits += 1
                self._async_commits += 1
            if not in_flight:
                self._commit_lock.release()
            # (after a failed write, this one's records follow a hole in the log: failed too)
            self._complete(batch.acked, 0, failure)
        if self._queue:
            if commit_queued:
                self._commit_inline()
            else:
                self._schedule_inline()

    # --- the writer thread ------------------------------------------------------------------
    #
    # One thread owns the file from open to close: it takes whatever queued up while its
    # previous fsync ran, writes and fsyncs it, and hands the results to the event loop in one
    # call; header writes (trim, window, shutdown) are requests it serves between batches. The
    # event loop never waits for it, and nothing goes through the loop between two commits.

    def _writer_main(self) -> None:
        try:
            while True:
                with self._cond:
                    while not (self._queue or self._header_requests or self._closing):
                        self._writer_idle = True
                        self._cond.wait()
                    self._writer_idle = False
                    requests = list(self._header_requests)
                    self._header_requests.clear()
                    finished = self._closing and not self._queue and not requests
                    if finished:
                        self._writer_done = True
                with self._commit_lock:
                    for request in requests:
                        self._serve_header(request)
                    if finished:
                        self._shut_down()
                        return
                    if self._failed is not None:
                        self._fail_queued(self._failed)
                        continue
                    planned = self._plan_batch()
                    if planned is not None and planned[0]:
                        self._commit(*planned)
        except BaseException as exc:  # a bug, not an I/O error: fail everything, never hang
            failure = WALError(f"WAL writer stopped: {exc!r}")
            failure.__cause__ = exc
            self._failed = self._failed or failure
            with self._cond:
                self._writer_done = True
                requests = list(self._header_requests)
                self._header_requests.clear()
            for request in requests:
                self._post(_set_exception, request.future, failure)
            self._fail_queued(failure)
            self._post(self._enter_failed, failure)
            self._post(_set_result, self._exited, None)

    def _post(self, callback: Callable[..., object], *args: object) -> None:
        """Run ``callback(*args)`` on the event loop (which may be gone if nobody closed us)."""
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, *args)

    def _plan_batch(self, *, blocking: bool = True) -> tuple[list[Acked], list[Write]] | None:
        """Take queued appends into one batch and give each its offset.

        The batch ends at the queue end, at the window, or at a record the ring has no room for
        yet; with an empty batch, that record waits (backpressure) until a header request (a
        ``trim()``) or the close arrives, and ``None`` is returned so the caller serves it.
        Not ``blocking`` (the event loop's inline commit), the batch just ends there.
        """
        acked: list[Acked] = []
        writes: list[Write] = []
        dropped = 0
        # after the asynchronous commits in flight, if any (only the loop plans while they are)
        in_flight = self._async.batches if self._async is not None else None
        cursor = in_flight[-1].acked[-1][2] if in_flight else self._next
        taken = time.perf_counter()
        while self._queue:
            pending = self._queue[0]
            if pending.future.done():  # cancelled by its caller before being written
                self._queue.popleft()
                dropped += pending.size
                continue
            size = pending.size
            start, padding = ring_file.place(cursor, size, self._capacity)
            if start + size > self._trim + self._capacity:
                if acked or not blocking:
                    break
                if self._trim == cursor:
                    # Nothing is live: the record is only blocked by the unused tail of the lap,
                    # which no caller's trim can free; trim to the lap start ourselves.
                    if not self._write_header_or_fail(trim_offset=start):
                        break
                    continue
                if self._closing:
                    self._fail_queued(
                        WALError(f"WAL {self._path} closed while appends waited for ring space")
                    )
                    break
                with self._cond:
                    while not (self._header_requests or self._closing):
                        self._cond.wait()
                break
            if start + size - self._next > self._window:
                if acked or cursor != self._next:  # (the writes in flight are done first)
                    break
                # A single record wider than the window: widen it durably first, so recovery
                # zeroes far enough should this write be torn.
                grown = -(-(start + size - self._next) // _WINDOW_GRANULE) * _WINDOW_GRANULE
                if not self._write_header_or_fail(window=grown):
                    break
                continue
            self._queue.popleft()
            pending.taken = taken
            if padding is not None and padding >= self._trim:
                writes.append(Write(padding, HEADER_SIZE, None, start))
            writes.append(Write(start, size, pending.parts))
            acked.append((pending, start, start + size))
            cursor = start + size
        if dropped:
            self._post(self._complete, [], dropped, None)
        return (acked, writes) if acked else None

    def _commit(self, acked: list[Acked], writes: list[Write], *, inline: bool = False) -> None:
        """Write and fsync one batch, then hand its results to the event loop (``inline``:
        on it, acknowledged at once)."""
        try:
            self._write_and_sync(writes)
        except BaseException as exc:
            # Never retry after a failed fsync: the kernel may have dropped the dirty pages, so
            # a later "successful" fsync would acknowledge lost data.
            self._fail_batch(acked, repr(exc), exc, on_loop=False)
            if not isinstance(exc, Exception):
                raise
            return
        self._count_commit(acked, sum(write.size for write in writes))
        if inline:
            self._complete(acked, 0, None)
        else:
            self._post(self._complete, acked, 0, None)

    def _count_commit(self, acked: list[Acked], written: int) -> None:
        """A batch is durable: the file's next offset moves past it."""
        self._next = acked[-1][2]
        self._fsyncs += 1
        self._bytes += written
        self._appends += len(acked)

    def _fail_batch(
        self,
        acked: list[Acked],
        reason: str,
        cause: BaseException | None,
        *,
        on_loop: bool,
    ) -> None:
        """A batch's write or fsync failed: fail it, everything queued and every later append
        (``on_loop``: called on the event loop, which is told at once rather than posted to)."""
        failure = WALError(
            f"WAL {self._path}: writing offsets [{acked[0][1]}, {acked[-1][2]}) failed; the WAL"
            f" accepts no more appends: {reason}"
        )
        failure.__cause__ = cause
        self._failed = failure
        if on_loop:
            self._complete(acked, 0, failure)
        else:
            self._post(self._complete, acked, 0, failure)
        self._fail_queued(failure)
        if on_loop:
            self._enter_failed(failure)
        else:
            self._post(self._enter_failed, failure)

    def _complete(self, acked: list[Acked], dropped: int, failure: WALError | None) -> None:
        """On the event loop: a batch was written (or failed), or cancelled appends dropped."""
        self._unwritten -= dropped + sum(stop - start for _, start, stop in acked)
        now = time.perf_counter()
        for pending, start, stop in acked:
            if pending.future.done():
                continue
            if failure is None:
                self._queued_times.append(pending.taken - pending.submitted)
                self._wait_times.append(now - pending.submitted)
                pending.future.set_result(WALAppendResult(start, stop))
            else:
                pending.future.set_exception(failure)
            if pending.on_done is not None:
                try:
                    pending.on_done(pending.future)
                except Exception:  # as the loop does for a failing callback: log, go on
                    logger.exception("WAL %s: a completion callback failed", self._path)
        _call_each(self.after_acknowledgements, self._path)

    def _write_and_sync(self, writes: list[Write]) -> None:
        """Encode and durably write one batch: one vectored write per contiguous run of the
        ring (the file is open with O_DSYNC)."""
        fill = self._page_fill(writes[-1].offset + writes[-1].size)
        runs = wal_batch.write_runs(writes, self._capacity, fill)
        started = time.perf_counter()
        written = 0
        for position, buffers in runs:
            written += pwrite_all(self._fd, buffers, position)
        # the file is open with O_DSYNC: written is durable
        self._timed(time.perf_counter() - started, written)

    def _timed(self, seconds: float, size: int) -> None:
        """Keep a durable write's time (``seconds``, ``size`` bytes); log it if slow (on the
        loop or the writer thread, whichever wrote)."""
        self._write_times.append(seconds)
        if seconds >= DEBUG_SLOW_WRITE_S:
            slow_writes.log(
                logging.WARNING if seconds >= SLOW_WRITE_S else logging.DEBUG,
                "WAL %s: a durable write of %d bytes took %.1f ms",
                self._path,
                size,
                seconds * 1000,
            )

    def _page_fill(self, end: int) -> int:
        """The zeros to write after a batch ending at ``end`` (``batch.page_fill``)."""
        return wal_batch.page_fill(end, self._capacity, self._trim)

    def _fail_queued(self, failure: WALError) -> None:
        """In the writer thread: fail every queued append."""
        failed: list[Acked] = []
        with self._cond:
            while self._queue:
                pending = self._queue.popleft()
                failed.append((pending, 0, pending.size))
        if failed:
            self._post(self._complete, failed, 0, failure)

    def _enter_failed(self, failure: WALError) -> None:
        """On the event loop: remember the first failure and say so once."""
        if self._failed is None:
            self._failed = failure
        if not self._failure_logged:
            self._failure_logged = True
            logger.error("WAL %s failed: %s", self._path, self._failed)
        with self._cond:
            self._cond.notify()  # the writer fails what is queued

    # --- trim, header, close --------------------------------------------------------------

    async def trim(self, offset: int) -> None:
        """Allow everything before ``offset`` to be overwritten, durably (the header is fsynced
        before this returns). ``offset`` must be a record boundary at or before
        ``next_offset``; a lower offset than the current trim offset is ignored."""
        self._check_open()
        if not self._recovered:
            raise WALError("consume recover() before trimming")
        if offset > self._next:
            raise WALError(f"cannot trim to {offset}: the log ends at {self._next}")
        if offset <= self._trim:
            return
        await self._write_header(trim_offset=offset)

    async def _write_header(
        self,
        *,
        trim_offset: int | None = None,
        window: int | None = None,
        shutdown_clean: bool = False,
    ) -> None:
        """Have the writer thread write the next header generation and fdatasync it."""
        future: asyncio.Future[None] = self._loop.create_future()
        with self._cond:
            if self._writer_done or self._closed:  # the descriptor may belong to another file
                raise WALError(f"WAL {self._path} is closed")
            self._header_requests.append(
                _HeaderRequest(trim_offset, window, shutdown_clean, future)
            )
            self._cond.notify()
        await future

    def _serve_header(self, request: _HeaderRequest) -> None:
        try:
            self._write_header_now(
                trim_offset=request.trim_offset,
                window=request.window,
                shutdown_clean=request.shutdown_clean,
            )
        except WALError as exc:
            self._post(_set_exception, request.future, exc)
        else:
            self._post(_set_result, request.future, None)

    def _write_header_or_fail(
        self, *, trim_offset: int | None = None, window: int | None = None
    ) -> bool:
        """A header write the writer needs for itself; False if it failed (the WAL has)."""
        try:
            self._write_header_now(trim_offset=trim_offset, window=window)
        except WALError:
            return False
        return True

    def _write_header_now(
        self,
        *,
        trim_offset: int | None = None,
        window: int | None = None,
        shutdown_clean: bool = False,
    ) -> None:
        """Write the next header generation to its slot and fdatasync it (in the writer thread,
        or before it starts); in-memory state follows only once it is durable, so the writer
        never relies on an undurable trim. A failed write fails the WAL."""
        if self._failed is not None:
            raise WALError(f"WAL {self._path} has failed") from self._failed
        current = self._header
        updated = dataclasses.replace(
            current,
            generation=current.generation + 1,
            trim_offset=max(current.trim_offset, trim_offset or 0),
            window=max(current.window, window or 0),
            flushed_offset=self._next if self._recovered else current.flushed_offset,
            shutdown_clean=shutdown_clean,
        )
        try:
            self._write_header_sync(updated)
        except OSError as exc:
            failure = WALError(f"WAL {self._path}: header write failed: {exc}")
            failure.__cause__ = exc
            self._failed = failure
            self._fail_queued(failure)
            self._post(self._enter_failed, failure)
            raise failure from exc
        self._header = updated
        self._trim = updated.trim_offset
        self._window = updated.window
        self._header_writes += 1

    def _write_header_sync(self, updated: WALHeader) -> None:
        os.pwrite(self._fd, wal_header.encode(updated), updated.position)
        os.fdatasync(self._fd)

    def _shut_down(self) -> None:
        """In the writer thread, once closing and nothing is left: record the shutdown in the
        header (unless the WAL failed) and let ``close()`` go on."""
        try:
            if self._failed is None and self._recovered:
                self._write_header_now(shutdown_clean=self._clean_close)
        except WALError as exc:
            self._post(_set_exception, self._exited, exc)
            return
        self._post(_set_result, self._exited, None)

    def _check_open(self) -> None:
        if self._closed:
            raise WALError(f"WAL {self._path} is closed")
        if self._failed is not None:
            raise WALError(
                f"WAL {self._path} is in a failed state after an earlier write error"
            ) from self._failed

    async def close(self, *, clean: bool = True) -> None:
        """Write and acknowledge the queued appends, then record the shutdown in the header.

        Appends still waiting for ring space fail. ``clean=False`` leaves the header marked
        unclean, as a crash would. A failed WAL just closes its file.
        """
        if self._closed or self._closing:
            return
        self._clean_close = clean
        with self._cond:
            self._closing = True
            self._cond.notify()
        try:
            if self._thread is not None:
                await asyncio.shield(self._exited)
            logger.info("WAL %s: %s", self._path, self.timing_summary())
        finally:
            self._closed = True
            if self._async is not None:
                self._async.stop_checking()
            if self._thread is not None:
                await asyncio.to_thread(self._thread.join)
            if self._async is not None and not self._async.batches:
                self._stop_ring()  # (else the kernel may still read the buffers in flight)
            os.close(self._fd)


def _call_each(listeners: list[Callable[[], object]], where: str) -> None:
    for listener in listeners:
        try:
            listener()
        except Exception:
            logger.exception("WAL %s: an acknowledgement listener failed", where)


def _set_result(future: asyncio.Future[None], value: None) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[None], exc: BaseException) -> None:
    if not future.done():
        future.set_exception(exc)

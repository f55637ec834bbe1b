"""The file under a :class:`~storage.wal.file_wal.FileWAL`: its creation and opening
(:func:`open_file`), its lock, writes at a position, and the ring read back from the trim point
(:func:`scan`).

Positions: the record at logical offset ``o`` lies at file position ``HEADER_AREA_SIZE + o %
capacity``; a lap is ``capacity`` logical bytes, and no record crosses the end of one
(:func:`place`).
"""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import os
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass

from storage.wal import header as wal_header
from storage.wal import record
from storage.wal.errors import CorruptRecordError, WALError
from storage.wal.header import HEADER_AREA_SIZE, SLOT_COUNT, SLOT_SIZE, WALHeader
from storage.wal.interface import WALRecord
from storage.wal.record import HEADER_SIZE, Buffer

# the WAL's messages under one name, whichever of its modules logs them
logger = logging.getLogger("storage.wal.file_wal")

# How long open() waits for another process's lock on the file (see lock)
LOCK_WAIT_S = 5.0
_READ_CHUNK = 1024 * 1024
ZEROS_VIEW = memoryview(bytes(1024 * 1024))  # written as the zero fill: never copied
try:
    _IOV_MAX = os.sysconf("SC_IOV_MAX")
except (AttributeError, ValueError, OSError):  # pragma: no cover - not Linux
    _IOV_MAX = 1024


def lap_end(offset: int, capacity: int) -> int:
    return (offset // capacity + 1) * capacity


def place(cursor: int, size: int, capacity: int) -> tuple[int, int | None]:
    """Where a record of ``size`` bytes goes when the log ends at ``cursor``.

    Returns ``(start, padding_offset)``: ``start`` is ``cursor`` if the record fits before the
    end of the lap, else the next lap start; ``padding_offset`` is where a padding header must
    go (``None`` when nothing is skipped or fewer than 24 bytes are).
    """
    end = lap_end(cursor, capacity)
    if cursor + size <= end:
        return cursor, None
    return end, (cursor if end - cursor >= HEADER_SIZE else None)


def pwrite_all(fd: int, buffers: Sequence[Buffer], position: int) -> int:
    """Write ``buffers`` contiguously at ``position``, across IOV_MAX limits and short writes;
    the bytes written."""
    views = [memoryview(b).cast("B") for b in buffers]
    views = [v for v in views if len(v)]
    start = position
    i = 0
    while i < len(views):
        written = os.pwritev(fd, views[i : i + _IOV_MAX], position)
        if written <= 0:
            raise OSError(errno.EIO, f"pwritev wrote nothing at position {position}")
        position += written
        while written:
            n = len(views[i])
            if written >= n:
                written -= n
                i += 1
            else:
                views[i] = views[i][written:]
                written = 0
    return position - start


async def lock(fd: int, path: str) -> None:
    """Take the WAL for this process alone, for as long as ``fd`` is open: a second writer
    (another broker started on the same data) would interleave records and trim the ring
    under the first.

    A process killed with a write in its io_uring keeps the file open after it has exited,
    until the kernel has finished that write: its lock goes with it, so this waits up to
    ``LOCK_WAIT_S`` for it (recovering before that write lands could append where it then
    lands)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise WALError(
                    f"WAL file {path} is in use by another process: is another broker running "
                    f"on the same s3.wal.path?"
                ) from None
        if not waited:
            waited = True
            logger.info("WAL %s: waiting for the process that held it to let go", path)
        await asyncio.sleep(0.02)


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def preallocate(fd: int, size: int) -> None:
    # fallocate reserves the blocks so a full disk shows up now, not as a failed append later;
    # some filesystems do not support it, where a sparse file is the best we can do.
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, size)


def pwrite_zeros(fd: int, position: int, length: int) -> None:
    """Write ``length`` zero bytes at file ``position``, a MiB at a time."""
    end = position + length
    while position < end:
        n = min(len(ZEROS_VIEW), end - position)
        pwrite_all(fd, [ZEROS_VIEW[:n]], position)
        position += n


def zero_range(fd: int, start: int, end: int, capacity: int) -> None:
    """Zero logical range ``[start, end)`` of the ring and fdatasync."""
    offset = start
    while offset < end:
        stop = min(end, lap_end(offset, capacity))
        pwrite_zeros(fd, HEADER_AREA_SIZE + offset % capacity, stop - offset)
        offset = stop
    if end > start:
        os.fdatasync(fd)


def write_zeros(fd: int, size: int) -> None:
    """Write zeros over ``[0, size)`` of ``fd`` and make them durable.

    fallocate only reserves blocks (ext4 and XFS mark them unwritten): the first write into one
    changes the file's extent map, so an O_DSYNC write there returns only after a journal
    commit. Measured (bench/README.md), saturated produce into a fresh ring: WAL write p50
    1.0 ms and p99 21-23 ms into allocated blocks, 0.6 ms and 7-8 ms into written ones.
    PostgreSQL zero-fills new WAL segments for the same reason (wal_init_zero).
    """
    pwrite_zeros(fd, 0, size)
    os.fdatasync(fd)
    # The zeroed pages stay in the page cache (the kernel reclaims them under pressure): each
    # commit then writes into a cached page instead of allocating one, which on this VM meant
    # a fault to the host per 4 KiB (its freed memory is handed back). Dropping them here made
    # the first lap's commits cost the broker 0.63-0.67 cores at 288 MB/s of saturated
    # produce, against 0.52-0.53 at 291-335 MB/s kept; WAL write p99 25 -> 7 ms. A ring
    # rewritten lap after lap is cached in steady state anyway.


def create_file(
    path: str, capacity: int, node_id: int, window: int, init_zero: bool = False
) -> None:
    """Create the WAL file fully formed: built under a temporary name, then renamed, so a crash
    during creation never leaves a file without a valid header."""
    tmp = path + ".creating"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        preallocate(fd, HEADER_AREA_SIZE + capacity)
        if init_zero:
            write_zeros(fd, HEADER_AREA_SIZE + capacity)
        for generation in range(SLOT_COUNT):
            empty = WALHeader(
                generation=generation,
                capacity=capacity,
                trim_offset=0,
                flushed_offset=0,
                window=window,
                node_id=node_id,
                shutdown_clean=True,
            )
            os.pwrite(fd, wal_header.encode(empty), empty.position)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path)


async def open_file(
    path: str, capacity: int, node_id: int, window: int, init_zero: bool
) -> tuple[int, WALHeader, bool]:
    """Open the WAL file at ``path``, creating it (``create_file``) if it does not exist, and
    take it for this process (``lock``): the descriptor, the header found, and whether the
    file was created. The descriptor is ``O_DSYNC``: a write returns once its data is durable,
    so a group commit is one ``pwritev``, not a ``pwritev`` and an ``fdatasync`` (one less
    hand-back of the GIL per commit). A file of another capacity or node id is refused."""
    created = not os.path.exists(path)
    if created:
        # the broker's largest file, reserved in full now: say how big
        logger.info(
            "WAL %s: preallocating %d bytes (%.1f MiB: s3.wal.capacity %d + %d header bytes)%s",
            path,
            HEADER_AREA_SIZE + capacity,
            (HEADER_AREA_SIZE + capacity) / (1 << 20),
            capacity,
            HEADER_AREA_SIZE,
            " and writing zeros through them (s3.wal.init.zero)" if init_zero else "",
        )
        started = time.monotonic()
        await asyncio.to_thread(create_file, path, capacity, node_id, window, init_zero)
        if init_zero:
            elapsed = time.monotonic() - started
            logger.info(
                "WAL %s: %.1f MiB of zeros written in %.1f s (%.0f MB/s)",
                path,
                (HEADER_AREA_SIZE + capacity) / (1 << 20),
                elapsed,
                (HEADER_AREA_SIZE + capacity) / max(elapsed, 1e-6) / 1e6,
            )
    fd = os.open(path, os.O_RDWR | os.O_DSYNC)
    try:
        await lock(fd, path)
        copies = [os.pread(fd, wal_header.ENCODED_SIZE, slot * SLOT_SIZE) for slot in (0, 1)]
        found, problems = wal_header.choose(copies)
        for problem in problems:
            logger.warning(
                "WAL %s: header %s; using the copy with generation %d",
                path,
                problem,
                found.generation,
            )
        if found.capacity != capacity:
            raise WALError(
                f"WAL file {path} has capacity {found.capacity} bytes but s3.wal.capacity is"
                f" {capacity}; the capacity of an existing WAL cannot change"
            )
        if found.node_id != node_id:
            raise WALError(f"WAL file {path} belongs to node {found.node_id}, not node {node_id}")
        size = os.fstat(fd).st_size
        if size < HEADER_AREA_SIZE + capacity:
            # Only reachable by truncating the file from outside; the missing tail reads as
            # zeros, which recovery treats as the end of the log.
            logger.warning(
                "WAL %s is %d bytes, expected %d; extending it",
                path,
                size,
                HEADER_AREA_SIZE + capacity,
            )
            preallocate(fd, HEADER_AREA_SIZE + capacity)
    except BaseException:
        os.close(fd)
        raise
    return fd, found, created


class RingReader:
    """Reads the ring for recovery in 1 MiB chunks rather than two syscalls per record."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._start = 0
        self._chunk = b""

    def read(self, position: int, n: int) -> memoryview:
        """Up to ``n`` bytes at ``position`` (fewer only if the file is shorter)."""
        if self._start <= position and position + n <= self._start + len(self._chunk):
            begin = position - self._start
            return memoryview(self._chunk)[begin : begin + n]
        self._chunk = os.pread(self._fd, max(n, _READ_CHUNK), position)
        self._start = position
        return memoryview(self._chunk)[:n]


@dataclass(slots=True, frozen=True)
class ScanEnd:
    """Where :func:`scan` stopped: the end of the log, and why."""

    offset: int
    records: int
    cut: CorruptRecordError | None  # the invalid record it stopped at (None: the ring's limit)
    normal_end: bool  # never-written space or an earlier lap's record, not a torn one


def scan(fd: int, trim: int, capacity: int) -> Generator[WALRecord, None, ScanEnd]:
    """Yield every valid record from ``trim`` on, in order; return where the log ends.

    Stops at the first invalid record (bad magic, CRC or offset mismatch, length past the
    ring): that is where the log ends and where appends continue. Bodies are views into the
    chunks read (1 MiB at a time, not two system calls per record).
    """
    reader = RingReader(fd)
    # A valid record never reaches past trim + capacity: it would have overwritten live data.
    limit = trim + capacity
    offset = trim
    count = 0
    while True:
        end = lap_end(offset, capacity)
        if end - offset < HEADER_SIZE:
            if end > limit:
                break
            offset = end  # the writer skips a lap tail too short for any header
            continue
        if offset + HEADER_SIZE > limit:
            break
        position = HEADER_AREA_SIZE + offset % capacity
        raw = reader.read(position, HEADER_SIZE)
        try:
            head = record.decode_header(
                raw, offset, max_body_length=min(end, limit) - offset - HEADER_SIZE
            )
            if head.is_padding:
                if head.next_offset != end:
                    raise CorruptRecordError(
                        record.BAD_PADDING,
                        f"padding at {offset} ends at {head.next_offset}, the lap at {end}",
                    )
                offset = end
                continue
            body = reader.read(position + HEADER_SIZE, head.body_length)
            record.verify_body(head, body)
        except CorruptRecordError as exc:
            return ScanEnd(offset, count, exc, _is_normal_end(exc, raw, offset, capacity))
        count += 1
        yield WALRecord(offset, head.next_offset, body)
        offset = head.next_offset
    return ScanEnd(offset, count, None, True)


def _is_normal_end(exc: CorruptRecordError, raw: memoryview, offset: int, capacity: int) -> bool:
    """Whether a scan stopped where a log simply ends: never-written (zero) space, or a record
    from an earlier lap. Anything else is a torn or corrupted record."""
    if exc.reason == record.BAD_MAGIC and not any(raw):
        return True
    found = exc.found_offset
    return (
        exc.reason == record.OFFSET_MISMATCH
        and found is not None
        and found < offset
        and (offset - found) % capacity == 0
    )

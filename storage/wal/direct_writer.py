"""Durable writes that do not block the event loop: Linux AIO on an ``O_DIRECT | O_DSYNC`` file.

A blocking ``O_DSYNC`` write holds its thread for as long as the disk takes (0.12-0.17 ms
here for 4-64 KiB), and on the event loop nothing else runs meanwhile. ``io_submit`` of the
same write on a file open with ``O_DIRECT`` returns once the write is queued (~0.02 ms); the
kernel signals its completion, durable (``O_DSYNC``: the device's cache flushed), on an
eventfd the loop watches, and ``io_getevents`` reads the result.

``O_DIRECT`` moves whole blocks from aligned memory: each write starts and ends on a
``BLOCK`` boundary. The bytes of the first block before the write's start are the log's
previous bytes, kept from the previous write (or read back); the bytes after its end, to the
next boundary, are zeros, as the buffered path's page fill. Only one write is in flight at a
time: the next one rewrites the block the last one ended in.

``DirectWriter.open`` returns ``None`` where any of this is missing (``O_DIRECT`` on tmpfs,
AIO in some sandboxes), and the WAL writes as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import mmap
import os
import platform
from collections.abc import Callable, Sequence

from storage.wal.record import Buffer

logger = logging.getLogger(__name__)

BLOCK = 4096  # the alignment of every write: the page, and the disks' physical block

# x86_64 and arm64 (the generic table) system call numbers
_SYSCALLS = {
    "x86_64": (206, 207, 208, 209),
    "aarch64": (0, 1, 4, 2),
}
_IOCB_CMD_PWRITE = 1
_IOCB_FLAG_RESFD = 1
_MAX_EVENTS = 8


class _IOCB(ctypes.Structure):
    # struct iocb (linux/aio_abi.h), little-endian layout
    _fields_ = [
        ("aio_data", ctypes.c_uint64),
        ("aio_key", ctypes.c_uint32),
        ("aio_rw_flags", ctypes.c_int32),
        ("aio_lio_opcode", ctypes.c_uint16),
        ("aio_reqprio", ctypes.c_int16),
        ("aio_fildes", ctypes.c_uint32),
        ("aio_buf", ctypes.c_uint64),
        ("aio_nbytes", ctypes.c_uint64),
        ("aio_offset", ctypes.c_int64),
        ("aio_reserved2", ctypes.c_uint64),
        ("aio_flags", ctypes.c_uint32),
        ("aio_resfd", ctypes.c_uint32),
    ]


class _Event(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_uint64),
        ("obj", ctypes.c_uint64),
        ("res", ctypes.c_int64),
        ("res2", ctypes.c_int64),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


_libc: ctypes.CDLL | None = None


def _syscall() -> Callable[..., int]:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    syscall: Callable[..., int] = _libc.syscall
    return syscall


class DirectWriter:
    """One file's block-aligned durable writes through Linux AIO, one in flight at a time.

    ``submit(position, buffers)`` starts a write of the buffers at ``position``; the loop
    watches ``eventfd`` and calls ``reap()`` when it is readable, which gives the result
    (``True`` for a write done in full, else raises ``OSError``).
    """

    def __init__(self, fd: int, capacity: int, nrs: tuple[int, int, int, int]) -> None:
        self._fd = fd
        self._setup, self._destroy, self._getevents, self._submit = nrs
        self._call = _syscall()
        self._ctx = ctypes.c_ulong(0)
        self.eventfd = -1
        self._buffer: mmap.mmap | None = None
        self._address = 0
        self.capacity = capacity  # the most bytes one write may carry
        self._iocb = _IOCB()
        self._iocbs = (ctypes.POINTER(_IOCB) * 1)(ctypes.pointer(self._iocb))
        self._events = (_Event * _MAX_EVENTS)()
        self._no_wait = _Timespec(0, 0)
        self._expected = 0  # bytes the write in flight must report
        self.in_flight = False
        # The bytes of the block the last write ended in, up to its end: the next write, if it
        # starts there, rewrites them. ``_tail_end`` is the file position they end at.
        self._tail_end = -1
        self._tail = b""

    @classmethod
    def open(cls, path: str, capacity: int) -> DirectWriter | None:
        """A writer for ``path`` taking writes of up to ``capacity`` bytes, or ``None`` (logged)
        where this system offers no direct asynchronous writes."""
        nrs = _SYSCALLS.get(platform.machine())
        if nrs is None or not hasattr(os, "O_DIRECT") or not hasattr(os, "eventfd"):
            logger.info("WAL %s: no Linux AIO here; writes block their thread", path)
            return None
        try:
            fd = os.open(path, os.O_RDWR | os.O_DIRECT | os.O_DSYNC)
        except OSError as exc:  # tmpfs: EINVAL
            logger.info(
                "WAL %s: the filesystem refuses O_DIRECT (%s); writes block their thread",
                path,
                exc.strerror,
            )
            return None
        writer = cls(fd, capacity, nrs)
        try:
            writer._start()
        except OSError as exc:
            writer.close()
            logger.info(
                "WAL %s: Linux AIO unavailable (%s); writes block their thread", path, exc.strerror
            )
            return None
        return writer

    def _start(self) -> None:
        if self._call(self._setup, _MAX_EVENTS, ctypes.byref(self._ctx)) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # an anonymous map is page-aligned: room for a leading block, the data, a trailing one
        self._buffer = mmap.mmap(-1, self.capacity + 2 * BLOCK)
        self._address = ctypes.addressof(ctypes.c_char.from_buffer(self._buffer))

    def forget_tail(self) -> None:
        """The file was written another way: read the last block back before the next write."""
        self._tail_end = -1

    def fits(self, position: int, length: int, limit: int) -> bool:
        """Whether a write of ``length`` bytes at ``position``, widened to whole blocks, stays
        within ``limit`` (the first file position it must not touch) and the buffer."""
        start = position - position % BLOCK
        end = -(-(position + length) // BLOCK) * BLOCK
        return end <= limit and end - start <= self.capacity + 2 * BLOCK

    def submit(self, position: int, buffers: Sequence[Buffer], read_fd: int) -> None:
        """Start writing ``buffers`` at ``position`` (``fits`` must hold); the bytes of the first
        block before it come from the last write, or from ``read_fd`` (a buffered descriptor
        of the same file) when the file was written another way since."""
        assert self._buffer is not None and not self.in_flight
        staging = self._buffer
        start = position - position % BLOCK
        lead = position - start
        if lead:
            if self._tail_end == position:
                staging[:lead] = self._tail
            else:
                head = os.pread(read_fd, lead, start)
                if len(head) != lead:
                    raise OSError(errno.EIO, f"short read of the WAL's block at {start}")
                staging[:lead] = head
        at = lead
        for buffer in buffers:
            view = memoryview(buffer).cast("B")
            staging[at : at + len(view)] = view
            at += len(view)
        end = -(-at // BLOCK) * BLOCK
        staging[at:end] = bytes(end - at)
        last = at - at % BLOCK
        self._tail = staging[last:at]
        self._tail_end = start + at
        cb = self._iocb
        cb.aio_lio_opcode = _IOCB_CMD_PWRITE
        cb.aio_fildes = self._fd
        cb.aio_buf = self._address
        cb.aio_nbytes = end
        cb.aio_offset = start
        cb.aio_flags = _IOCB_FLAG_RESFD
        cb.aio_resfd = self.eventfd
        self._expected = end
        if self._call(self._submit, self._ctx, 1, self._iocbs) != 1:
            code = ctypes.get_errno() or errno.EIO
            self._tail_end = -1
            raise OSError(code, f"io_submit: {os.strerror(code)}")
        self.in_flight = True

    def reap(self) -> bool:
        """After ``eventfd`` turned readable: ``True`` once the write in flight completed in
        full, ``False`` if it has not completed yet; raises ``OSError`` for a failed write."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.eventfd)
        if not self.in_flight:
            return False
        got = self._call(
            self._getevents, self._ctx, 0, _MAX_EVENTS, self._events, ctypes.byref(self._no_wait)
        )
        if got < 0:
            code = ctypes.get_errno() or errno.EIO
            raise OSError(code, f"io_getevents: {os.strerror(code)}")
        if got == 0:
            return False
        self.in_flight = False
        res = self._events[0].res
        if res < 0:
            self._tail_end = -1
            raise OSError(-res, os.strerror(-res))
        if res != self._expected:
            self._tail_end = -1
            raise OSError(errno.EIO, f"short direct write: {res} of {self._expected} bytes")
        return True

    def close(self) -> None:
        """Release the AIO context, the eventfd, the buffer and the descriptor (nothing may be
        in flight)."""
        if self._ctx.value:
            self._call(self._destroy, self._ctx)
            self._ctx = ctypes.c_ulong(0)
        if self.eventfd >= 0:
            os.close(self.eventfd)
            self.eventfd = -1
        if self._buffer is not None:
            self._tail = b""
            self._address = 0
            with contextlib.suppress(BufferError):  # a view exported: it goes with the object
                self._buffer.close()
            self._buffer = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

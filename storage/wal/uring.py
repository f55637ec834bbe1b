"""Durable writes the event loop does not wait for: an io_uring whose completions are
signalled on an eventfd the loop watches.

A buffered ``O_DSYNC`` write returns once the disk has the data, so a commit written on the
event loop holds the loop for as long as the disk takes (0.2-0.4 ms usually, 20-100 ms when
a virtual disk stalls), and one handed to a Python thread costs a wake-up, a core and the GIL
to hand the result back. Submitted to an io_uring, the same write (``IORING_OP_WRITE`` on the
``O_DSYNC`` descriptor) returns to the caller in tens of microseconds; one of the kernel's
io-wq workers makes it, through the page cache as before (the upload worker reads the WAL
from there), and posts the result. No Python thread takes part.

A write may be queued behind those in flight (``after_others``): it carries
``IOSQE_IO_DRAIN``, so the kernel starts it only once every write submitted before it has
completed, without the caller's turn in between. Writes that share a page (a commit's zeros to
its page's end, the next commit's first bytes) then land in submission order.

A completion the kernel could not post to the completion ring goes to its overflow list
instead, where it stays until the application calls ``io_uring_enter`` with
``IORING_ENTER_GETEVENTS`` (the ring's ``IORING_SQ_CQ_OVERFLOW`` flag says so). A writer that
waits for its writes before submitting more would wait forever: :meth:`RingWriter.reap` and
:meth:`RingWriter.completed` flush that list first (liburing's ``io_uring_peek_cqe`` does the
same). Seen here: two completions in the overflow list of a ring whose completion ring was
empty, the broker's WAL commits stopped for good.

The rings are shared memory the submitter writes with plain stores: that is safe on x86-64,
whose stores are seen in program order; elsewhere, or where the kernel refuses io_uring
(disabled by ``kernel.io_uring_disabled``, a container's seccomp profile, a kernel before
5.6), :func:`open_ring` returns None with the reason and the caller writes as before.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import platform
import struct
from typing import Any

_SETUP, _ENTER, _REGISTER = 425, 426, 427  # the same numbers on every architecture
_REGISTER_EVENTFD = 4
_ENTER_GETEVENTS = 1 << 0
_SQ_CQ_OVERFLOW = 1 << 1  # in the submission ring's flags: completions wait in the overflow list
_OP_WRITE = 23
_IOSQE_IO_DRAIN = 1 << 1
_OFF_SQES = 0x10000000
_ENTRIES = 4
_SQE_SIZE = 64
_CQE_SIZE = 16
_U32 = struct.Struct("<I")
# the start of struct io_uring_sqe: opcode, flags, ioprio, fd, off, addr, len, rw_flags,
# user_data (the rest stays zero)
_SQE = struct.Struct("<BBHiQQIIQ")
_CQE = struct.Struct("<Qi")  # user_data, res


class _SqOffsets(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_uint32) for name in ("head", "tail", "ring_mask", "ring_entries")),
        *((name, ctypes.c_uint32) for name in ("flags", "dropped", "array", "resv1")),
        ("user_addr", ctypes.c_uint64),
    ]


class _CqOffsets(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_uint32) for name in ("head", "tail", "ring_mask", "ring_entries")),
        *((name, ctypes.c_uint32) for name in ("overflow", "cqes", "flags", "resv1")),
        ("user_addr", ctypes.c_uint64),
    ]


class _Params(ctypes.Structure):
    _fields_ = [
        *((name, ctypes.c_uint32) for name in ("sq_entries", "cq_entries", "flags")),
        *((name, ctypes.c_uint32) for name in ("sq_thread_cpu", "sq_thread_idle", "features")),
        ("wq_fd", ctypes.c_uint32),
        ("resv", ctypes.c_uint32 * 3),
        ("sq_off", _SqOffsets),
        ("cq_off", _CqOffsets),
    ]


class RingWriter:
    """Writes of its ``staging`` buffers into ``fd``, at most one per buffer in flight;
    ``eventfd`` turns readable when one completes. Use from one thread (the event loop's)."""

    def __init__(
        self, fd: int, ring_fd: int, params: _Params, syscall: Any, size: int, buffers: int = 1
    ) -> None:
        self.fd = fd
        self._ring_fd = ring_fd
        self._syscall = syscall
        self._sq = params.sq_off
        self._cq = params.cq_off
        ring_size = max(
            params.sq_off.array + params.sq_entries * 4,
            params.cq_off.cqes + params.cq_entries * _CQE_SIZE,
        )
        shared = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        writable = mmap.PROT_READ | mmap.PROT_WRITE
        self._ring = mmap.mmap(ring_fd, ring_size, shared, writable, offset=0)
        self._sqes = mmap.mmap(
            ring_fd, params.sq_entries * _SQE_SIZE, shared, writable, offset=_OFF_SQES
        )
        self._sq_mask = _U32.unpack_from(self._ring, self._sq.ring_mask)[0]
        self._cq_mask = _U32.unpack_from(self._ring, self._cq.ring_mask)[0]
        self.eventfd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        # one buffer per write that may be in flight at once (the ring has room for them all)
        self.staging = [mmap.mmap(-1, size) for _ in range(min(buffers, params.sq_entries))]
        self._addresses = []
        for buffer in self.staging:
            anchor = ctypes.c_char.from_buffer(buffer)
            self._addresses.append(ctypes.addressof(anchor))
            del anchor  # the mapping stays until close(); an export would keep it from closing

    def register(self) -> None:
        descriptor = ctypes.c_int32(self.eventfd)
        done = self._syscall(
            _REGISTER, self._ring_fd, _REGISTER_EVENTFD, ctypes.byref(descriptor), 1
        )
        if done != 0:
            code = ctypes.get_errno()
            raise OSError(code, f"io_uring_register: {os.strerror(code)}")

    def submit(self, buffer: int, position: int, length: int, *, after_others: bool) -> None:
        """Queue the write of ``staging[buffer][:length]`` at file ``position``; its completion
        carries ``buffer`` as its tag. ``after_others``: the kernel starts it once every write
        submitted before it has completed. Raises OSError when the kernel refuses it."""
        tail = _U32.unpack_from(self._ring, self._sq.tail)[0]
        index = tail & self._sq_mask
        at = index * _SQE_SIZE
        self._sqes[at : at + _SQE_SIZE] = bytes(_SQE_SIZE)
        flags = _IOSQE_IO_DRAIN if after_others else 0
        address = self._addresses[buffer]
        _SQE.pack_into(
            self._sqes, at, _OP_WRITE, flags, 0, self.fd, position, address, length, 0, buffer
        )
        _U32.pack_into(self._ring, self._sq.array + index * 4, index)
        _U32.pack_into(self._ring, self._sq.tail, tail + 1)
        submitted = self._syscall(_ENTER, self._ring_fd, 1, 0, 0, None, 0)
        if submitted != 1:
            code = ctypes.get_errno() if submitted < 0 else 0
            # the entry was not consumed: take it back
            _U32.pack_into(self._ring, self._sq.tail, tail)
            raise OSError(code or 5, f"io_uring_enter: {os.strerror(code or 5)}")

    def reaped(self) -> int:
        """How many completions have been reaped so far (the completion ring's head, which
        wraps at 2**32)."""
        return int(_U32.unpack_from(self._ring, self._cq.head)[0])

    def completed(self) -> bool:
        """Whether a completion waits to be reaped (loads from the shared ring; a system call
        only to flush completions the kernel left in its overflow list)."""
        self._flush_overflow()
        head = _U32.unpack_from(self._ring, self._cq.head)[0]
        return head != _U32.unpack_from(self._ring, self._cq.tail)[0]

    def _flush_overflow(self) -> None:
        """Have the kernel move the completions of its overflow list into the completion ring,
        if it holds any."""
        if _U32.unpack_from(self._ring, self._sq.flags)[0] & _SQ_CQ_OVERFLOW:
            self._syscall(_ENTER, self._ring_fd, 0, 0, _ENTER_GETEVENTS, None, 0)

    def reap(self) -> list[tuple[int, int]]:
        """The writes completed since the last call, in completion order: each one's buffer
        tag and result (bytes written, or a negative errno). Call when ``eventfd`` is
        readable."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.eventfd)
        done: list[tuple[int, int]] = []
        while True:
            self._flush_overflow()
            head = _U32.unpack_from(self._ring, self._cq.head)[0]
            tail = _U32.unpack_from(self._ring, self._cq.tail)[0]
            if head == tail:
                return done
            while head != tail:
                at = self._cq.cqes + (head & self._cq_mask) * _CQE_SIZE
                tag, result = _CQE.unpack_from(self._ring, at)
                done.append((tag, result))
                head += 1
            _U32.pack_into(self._ring, self._cq.head, head)

    def close(self) -> None:
        """Release the ring (no write may be in flight); ``fd`` stays open."""
        self._sqes.close()
        self._ring.close()
        os.close(self._ring_fd)
        os.close(self.eventfd)
        for buffer in self.staging:
            buffer.close()


def open_ring(fd: int, staging_size: int, buffers: int = 1) -> tuple[RingWriter | None, str]:
    """A :class:`RingWriter` for ``fd`` with ``buffers`` staging buffers of ``staging_size``
    bytes each, or None and why it cannot be had here."""
    if platform.machine() not in ("x86_64", "AMD64") or not hasattr(os, "eventfd"):
        return None, f"no io_uring for this platform ({platform.system()} {platform.machine()})"
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    except OSError as exc:
        return None, f"the C library could not be loaded: {exc}"
    syscall = libc.syscall
    syscall.restype = ctypes.c_long
    params = _Params()
    ring_fd = syscall(_SETUP, ctypes.c_uint32(_ENTRIES), ctypes.byref(params))
    if ring_fd < 0:
        code = ctypes.get_errno()
        return None, f"the kernel refuses io_uring ({os.strerror(code)})"
    try:
        writer = RingWriter(fd, ring_fd, params, syscall, staging_size, buffers)
    except OSError as exc:
        os.close(ring_fd)
        return None, f"the io_uring could not be mapped ({exc})"
    try:
        writer.register()
    except OSError as exc:
        writer.close()
        return None, f"its completions cannot be signalled ({exc.strerror})"
    return writer, ""

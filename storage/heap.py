"""The C heap of the processes that move large buffers (the broker and its upload worker):
glibc malloc's settings for them, the broker's pre-touch of the heap its caches fill, and
:func:`heap_buffer`, uninitialised page-aligned memory from that heap."""

from __future__ import annotations

import ctypes
import logging
import mmap
import sys
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("automq.heap")

PAGE = mmap.PAGESIZE
MADV_POPULATE_WRITE = 23  # Linux 5.14: fault a range's pages in, writable, in one call


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


def _libc_allocator(
    libc: ctypes.CDLL | None,
) -> tuple[Callable[[int], int | None], Callable[[int], None]] | None:
    if libc is None or not hasattr(libc, "malloc") or not hasattr(libc, "free"):
        return None
    malloc, free = libc.malloc, libc.free
    malloc.restype = ctypes.c_void_p
    malloc.argtypes = [ctypes.c_size_t]
    free.restype = None
    free.argtypes = [ctypes.c_void_p]
    return malloc, free


def _libc_madvise(libc: ctypes.CDLL | None) -> Callable[[int, int, int], int] | None:
    if libc is None or not hasattr(libc, "madvise"):
        return None
    madvise = libc.madvise
    madvise.restype = ctypes.c_int
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _libc_mallopt(libc: ctypes.CDLL | None) -> Callable[[int, int], int] | None:
    if libc is None or not hasattr(libc, "mallopt"):  # not glibc (musl has no mallopt)
        return None
    mallopt = libc.mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return mallopt


_LIBC = _load_libc()
ALLOCATOR = _libc_allocator(_LIBC)  # (malloc, free), None without a C library to load
MADVISE = _libc_madvise(_LIBC)
_MALLOPT = _libc_mallopt(_LIBC) if sys.platform.startswith("linux") else None

# glibc gives each allocation above its mmap threshold its own mapping and unmaps it when freed.
# Cold reads allocate a buffer of MiBs per ranged GET and keep it in the block cache for a
# while, and the upload worker builds each object in one: a fresh mapping for each costs a page
# fault per 4 KiB, which measured as much CPU as the rest of the read path together. Up to
# 32 MiB (glibc's largest threshold, above the 16 MiB largest merged GET), allocations come from
# the heap instead and freed space is reused; the heap is trimmed only above 256 MiB of free
# space at its top, so it does not shrink and regrow with every eviction.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 << 20
_TRIM_THRESHOLD = 256 << 20


def keep_large_buffers_in_heap() -> None:
    """Tune glibc's malloc for large, short-lived buffers (no-op elsewhere)."""
    if _MALLOPT is None:
        return
    if not (
        _MALLOPT(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
        and _MALLOPT(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    ):
        log.warning("mallopt refused the heap settings; large buffers stay in their own mappings")


# Pre-touch (see pretouch_heap): chunks below the mmap threshold, so that they come from the
# heap, which keeps them once freed
_PRETOUCH_CHUNK = 16 << 20


def pretouch_heap(wanted: int) -> int:
    """Fault in ``wanted`` bytes of heap (at most half the memory available to the process)
    and free them, kept by the heap: the buffers the LogCache and the block cache fill later
    reuse pages already mapped. The JVM's ``AlwaysPreTouch`` does this for its heap.

    A new page costs a fault the first time it is written, and on a virtual machine whose
    host backs guest memory lazily (or takes back what the guest freed) far more than the
    kernel's zeroing: 0.26-0.37 s of CPU per 256 MiB here, against 0.02 s to write it again.
    A new broker pays that for the first GB it is sent or reads back, on the event loop: at 20
    MB/s, 105,000 faults in 20 s, and 15.2-15.4 s of CPU per GB produced against 13.2-14.0 once
    its caches had filled. Returns the bytes touched (0 where glibc's malloc is not there)."""
    budget = min(wanted, _available_memory() // 2)
    if budget < _PRETOUCH_CHUNK or _MALLOPT is None or ALLOCATOR is None:
        return 0
    malloc, free = ALLOCATOR
    # the heap keeps what is freed at its top up to the trim threshold: all of it, and the
    # usual room above
    if not _MALLOPT(_M_TRIM_THRESHOLD, min(budget + _TRIM_THRESHOLD, 2**31 - 1)):
        return 0
    started = time.process_time()
    chunks: list[int] = []
    try:
        for _ in range(budget // _PRETOUCH_CHUNK):
            address = malloc(_PRETOUCH_CHUNK)
            if not address:
                break
            chunks.append(address)
            start = -address % PAGE
            length = (_PRETOUCH_CHUNK - start) // PAGE * PAGE
            if MADVISE is None or MADVISE(address + start, length, MADV_POPULATE_WRITE) != 0:
                ctypes.memset(address + start, 0, length)  # a kernel before 5.14
    finally:
        for address in reversed(chunks):  # from the top down: they merge into its free space
            free(address)
    touched = len(chunks) * _PRETOUCH_CHUNK
    log.info(
        "pre-touched %d MiB of heap for the caches in %.2f s of CPU",
        touched >> 20,
        time.process_time() - started,
    )
    return touched


def _available_memory() -> int:
    """Bytes the process may still take: the smaller of the system's MemAvailable and the
    room left under its memory cgroup's limit (v2's memory.max, v1's memory.limit_in_bytes)."""
    available = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
        groups = Path("/proc/self/cgroup").read_text().splitlines()
    except (OSError, ValueError, IndexError):
        return available
    for line in groups:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            files = Path("/sys/fs/cgroup", path.lstrip("/")), "memory.max", "memory.current"
        elif "memory" in controllers.split(","):
            files = (
                Path("/sys/fs/cgroup/memory", path.lstrip("/")),
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
            )
        else:
            continue
        try:
            limit = (files[0] / files[1]).read_text().strip()
            if limit != "max" and int(limit) < 1 << 60:  # (v1 says "no limit" with 2**63)
                used = int((files[0] / files[2]).read_text())
                available = min(available, int(limit) - used)
        except (OSError, ValueError):
            continue  # not mounted here, or not readable: nothing to honour
    return max(0, available)


def aligned_bytearray(size: int, align: int = PAGE) -> memoryview:
    """``size`` bytes of a bytearray, starting at an ``align``-aligned address."""
    raw = bytearray(size + align - 1)
    start = -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % align
    return memoryview(raw)[start : start + size]


class _Freed:
    """Frees a malloc'd address when the buffer that owns it goes."""

    __slots__ = ("address",)

    def __init__(self, address: int) -> None:
        self.address = address

    def __del__(self) -> None:
        if ALLOCATOR is not None:  # (looked up here, not bound: a test replaces it)
            ALLOCATOR[1](self.address)


def size_class(size: int) -> int:
    """``size`` rounded up to an eighth of its power of two (whole pages)."""
    step = max(PAGE, (1 << max(0, size - 1).bit_length()) // 8)
    return -(-size // step) * step


def heap_buffer(size: int, *, populate: bool = False) -> memoryview:
    """``size`` bytes of page-aligned (as ``O_DIRECT`` wants), uninitialised memory from the C
    heap, freed once no view of it is left: for buffers filled by a read or a copy that writes
    every byte (the block cache's reads, a large request's frame). Memory the process freed
    (the LogCache's evicted payloads, reads the block cache let go) is reused as it is, where a
    new mapping costs the kernel's zeroing of every page and a fault per 4 KiB: cold reads of 2
    GiB through mappings reused only at their own size spent 18% of the broker's CPU in that
    zeroing. The heap keeps buffers up to 32 MiB (:func:`keep_large_buffers_in_heap`). Sizes
    are rounded by :func:`size_class`, so the few buffer types made are cached.

    ``populate``: fault in the pages not yet used in one call (``MADV_POPULATE_WRITE``), for a
    buffer filled by copies on the event loop rather than by a direct read, which faults them
    in from its worker thread: a fault per 4 KiB cost 0.96-1.05 s of CPU per GB against
    0.52-0.72 made at once."""
    padded = size_class(size + PAGE)
    if ALLOCATOR is None:
        return aligned_bytearray(size)
    address = ALLOCATOR[0](padded)
    if not address:
        raise MemoryError(f"malloc({padded}) failed")
    owner = (ctypes.c_char * padded).from_address(address)
    owner._freed = _Freed(address)  # type: ignore[attr-defined]
    start = -address % PAGE
    if populate and MADVISE is not None and size:
        MADVISE(address + start, -(-size // PAGE) * PAGE, MADV_POPULATE_WRITE)  # best effort
    return memoryview(owner).cast("B")[start : start + size]

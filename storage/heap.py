"""glibc malloc settings for the processes that move large buffers: the broker and its
upload worker."""

from __future__ import annotations

import ctypes
import logging
import sys

log = logging.getLogger("automq.heap")

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
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    if not (
        mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    ):
        log.warning("mallopt refused the heap settings; large buffers stay in their own mappings")

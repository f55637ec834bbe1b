"""The io_uring's kernel workers, which make the WAL's durable writes, at real-time priority.

An io_uring hands each write it cannot make without blocking (every ``O_DSYNC`` write of a
regular file) to a kernel worker thread of the submitting process, named ``iou-wrk-<tid>``. The
worker copies the data into the page cache, waits for the disk's write, then for its cache flush
(on a disk that takes no FUA writes), and completes the request: it wakes at least twice a
commit, and at normal priority each wake-up waits for a core. On two cores a broker and its
clients keep both busy, and those waits were most of a commit's tail: 128 KiB ``O_DSYNC`` writes
every 6.5 ms beside two busy processes took p99 0.92 and 2.75 ms from a normal thread, 0.32 and
0.42 ms from a ``SCHED_FIFO`` one (the disk itself: p99 0.36-0.40 ms; the WAL's own appends:
``bench/wal_appends.py``).

So the WAL gives its ring's workers ``SCHED_FIFO`` at the lowest real-time priority
(``s3.wal.io.realtime``): a worker runs as it wakes, for the microseconds each step takes, ahead
of every normal thread, and sleeps on the disk the rest of the time (the kernel's real-time
throttling bounds it regardless). The kernel makes workers as requests need them and retires one
after a few idle seconds, and a new one starts at normal priority, so the WAL looks for new
workers once a second and at the first completion after an idle gap. Setting a real-time policy
needs ``CAP_SYS_NICE`` or an ``RLIMIT_RTPRIO`` of at least 1; refused, the WAL says so once and
its writes go on at normal priority.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

logger = logging.getLogger(__name__)

WORKER_PREFIX = "iou-wrk-"
PRIORITY = 1  # the lowest real-time priority: above every normal thread, below the kernel's own
TASK_DIR = "/proc/self/task"


def new_workers(
    tids: Iterable[str], known: set[str], comm_of: dict[str, str]
) -> tuple[list[int], set[str]]:
    """Of the process's threads ``tids``, the io_uring workers not in ``known`` (by their
    names in ``comm_of``; a thread without one has gone), and the threads to remember: every
    current one that was looked at, so that a thread is looked at once."""
    current = set(tids)
    fresh = [
        int(tid)
        for tid in sorted(current - known)
        if comm_of.get(tid, "").startswith(WORKER_PREFIX)
    ]
    return fresh, (known & current) | {tid for tid in current if tid in comm_of}


class WorkerPriority:
    """Gives this process's io_uring workers ``SCHED_FIFO`` as they appear (see the module's
    docstring). :meth:`raise_new` looks once; the owner calls it when workers may be new."""

    def __init__(self, task_dir: str = TASK_DIR, priority: int = PRIORITY) -> None:
        self._task_dir = task_dir
        self._priority = priority
        self._known: set[str] = set()
        self.raised = 0  # workers given the priority
        self.refused: OSError | None = None  # why not, once refused: no more tries

    def raise_new(self) -> int:
        """Set the policy of the workers that appeared since the last look; how many."""
        if self.refused is not None or not hasattr(os, "sched_setscheduler"):
            return 0
        try:
            tids = os.listdir(self._task_dir)
        except OSError:
            return 0
        comm_of: dict[str, str] = {}
        for tid in tids:
            if tid in self._known:
                continue
            try:
                with open(f"{self._task_dir}/{tid}/comm") as f:
                    comm_of[tid] = f.read().strip()
            except OSError:
                continue  # ended meanwhile
        fresh, self._known = new_workers(tids, self._known, comm_of)
        done = 0
        for worker in fresh:
            try:
                os.sched_setscheduler(worker, os.SCHED_FIFO, os.sched_param(self._priority))
            except ProcessLookupError:
                continue  # retired meanwhile
            except OSError as e:
                self.refused = e
                logger.info(
                    "the WAL's io_uring workers stay at normal priority (s3.wal.io.realtime: "
                    "SCHED_FIFO refused: %s; it needs CAP_SYS_NICE or an RLIMIT_RTPRIO of at "
                    "least %d): on busy cores its durable writes wait for a core to complete",
                    e.strerror or e,
                    self._priority,
                )
                return done
            done += 1
        self.raised += done
        if done:
            logger.debug("WAL: %d io_uring worker(s) set to SCHED_FIFO %d", done, self._priority)
        return done

"""How late the event loop runs: a task sleeps ``interval`` and records how much later than
that it woke. Anything that holds the loop (a long decode, a blocking call, the GIL taken by a
busy thread) shows up here; produce and fetch latency cannot be better than it.

With the ``automq.stalls`` logger at DEBUG (``log.level.automq.stalls=DEBUG``) a thread of its
own also looks, every few milliseconds, whether the loop has missed its tick by
``STACK_STALL_S``, and if so logs where the loop's thread is (its Python stack) once per
stall: the code that held the loop, the system call it blocked in, or where it waits for the
GIL.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterator

log = logging.getLogger("automq.loop")
stall_log = logging.getLogger("automq.stalls")

INTERVAL_S = 0.01
WINDOW = 60_000  # samples kept: ten minutes at the interval
SLOW_S = 0.5  # a single stall this long is logged as it happens
SLOW_COLLECTION_S = 0.02  # a garbage collection this long is logged as it happens
# at DEBUG (log.level.automq.loop=DEBUG), stalls and collections from these lengths on: the
# benches count them inside the window they measure
DEBUG_STALL_S = 0.01
DEBUG_COLLECTION_S = 0.005
# A full collection this long that freed at most this many objects walked objects that live as
# long as the broker (an S3 client's service models, loaded at its first request; a partition's
# state): CollectorPauses(freeze_survivors=True) then freezes them, as startup froze its own.
FREEZE_AFTER_S = 0.02
FREEZE_MAX_FREED = 1000
# automq.stalls at DEBUG: a stall is sampled once it has lasted this long past the tick, looked
# for every STACK_CHECK_S; STACK_FRAMES of the loop thread's innermost frames are logged
STACK_STALL_S = 0.015
STACK_CHECK_S = 0.005
STACK_FRAMES = 12


def nearest_rank(ordered: list[float], p: float) -> float:
    """The ``p``-th percentile (0-100) of ``ordered`` (sorted, not empty), nearest rank."""
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))]


class ThreadCpu:
    """The calling thread's time on a core and time waiting for one (runnable, another
    thread or process on every core), in nanoseconds since it started: Linux's
    ``/proc/thread-self/schedstat``, opened by the thread it describes. Elsewhere, or where
    the kernel keeps no such statistics, :meth:`read` gives None."""

    def __init__(self) -> None:
        self._fd: int | None = None
        with contextlib.suppress(OSError):
            self._fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)

    def read(self) -> tuple[int, int] | None:
        if self._fd is None:
            return None
        try:
            on_core, waiting, _ = os.pread(self._fd, 128, 0).split()
            return int(on_core), int(waiting)
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _this_thread_times() -> tuple[int, int] | None:
    """:meth:`ThreadCpu.read` once, for whichever thread calls it."""
    cpu = ThreadCpu()
    try:
        return cpu.read()
    finally:
        cpu.close()


class LoopLagMonitor:
    def __init__(self, interval_s: float = INTERVAL_S, window: int = WINDOW) -> None:
        self.interval_s = interval_s
        self.samples: deque[float] = deque(maxlen=window)
        self.last_tick = 0.0  # the event loop's time (monotonic) of the latest sample
        self._task: asyncio.Task[None] | None = None
        self._sampler: StallSampler | None = None

    def start(self) -> None:
        """Sample from now on (on the event loop's thread)."""
        self._task = asyncio.create_task(self._run(), name="loop-lag")
        if stall_log.isEnabledFor(logging.DEBUG):
            self._sampler = StallSampler(self.interval_s, threading.get_ident())
            self._sampler.start()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._sampler is not None:
            self._sampler.stop()
            self._sampler = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        # At DEBUG, each stall logged says how much of it the loop's thread spent waiting
        # for a core: a machine whose cores are busy with other work, not the broker's own.
        cpu = ThreadCpu() if log.isEnabledFor(logging.DEBUG) else None
        try:
            while True:
                before = loop.time()
                times = cpu.read() if cpu is not None else None
                await asyncio.sleep(self.interval_s)
                self.last_tick = loop.time()
                if self._sampler is not None:
                    self._sampler.ticked()
                lag = max(self.last_tick - before - self.interval_s, 0.0)
                self.samples.append(lag)
                if lag >= DEBUG_STALL_S:
                    if lag >= SLOW_S:
                        log.warning("the event loop stalled for %.0f ms", lag * 1000)
                    else:
                        log.debug(
                            "the event loop ran %.1f ms late%s",
                            lag * 1000,
                            _waited(times, cpu.read() if cpu is not None else None),
                        )
        finally:
            if cpu is not None:
                cpu.close()

    def percentiles(self) -> dict[str, float]:
        """p50, p99 and max lag in milliseconds over the samples kept (zeros if none)."""
        ordered = sorted(self.samples)
        if not ordered:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0}
        return {
            "p50": nearest_rank(ordered, 50) * 1000,
            "p99": nearest_rank(ordered, 99) * 1000,
            "max": ordered[-1] * 1000,
        }

    def summary(self) -> str:
        p = self.percentiles()
        return (
            f"event loop lag over {len(self.samples)} samples: p50 {p['p50']:.1f} ms, "
            f"p99 {p['p99']:.1f} ms, max {p['max']:.1f} ms"
        )


class StallSampler:
    """A daemon thread that logs (``automq.stalls``, DEBUG) the event loop thread's stack once
    per stall: whenever the loop has not ticked for its interval plus ``STACK_STALL_S``. It
    takes the GIL only for its checks, a few hundred times a second; when the loop's thread
    holds it in C code without letting go, the sample comes once that ends, from where it
    went on."""

    def __init__(self, interval_s: float, loop_thread: int) -> None:
        self._interval_s = interval_s
        self._loop_thread = loop_thread
        self._last_tick = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stall-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def ticked(self) -> None:
        """The loop ran its tick (called on the loop's thread)."""
        self._last_tick = time.monotonic()

    def _run(self) -> None:
        sampled_tick = -1.0  # the tick whose stall was logged
        while not self._stop.wait(STACK_CHECK_S):
            tick = self._last_tick
            held = time.monotonic() - tick - self._interval_s
            if held < STACK_STALL_S or tick == sampled_tick:
                continue
            sampled_tick = tick
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                return  # the loop's thread is gone
            stack = traceback.extract_stack(frame)[-STACK_FRAMES:]
            stall_log.debug(
                "the event loop has been held %.1f ms; its thread is in: %s",
                held * 1000,
                " <- ".join(
                    f"{entry.name} ({_short(entry.filename)}:{entry.lineno})"
                    for entry in reversed(stack)
                ),
            )


def _short(filename: str) -> str:
    """A source file's path from its package on (``automq_py/partition.py``)."""
    parts = filename.replace("\\", "/").split("/")
    for i, part in enumerate(parts):
        if part in ("automq_py", "storage", "protocol", "asyncio", "uvloop", "aiobotocore"):
            return "/".join(parts[i:])
    return "/".join(parts[-2:])


def _waited(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str:
    """Where the loop's thread spent a stall: on a core (running the broker's code), waiting
    for one, and the rest blocked (a system call, a page fault, the GIL)."""
    split = _split(before, after)
    return f" (its thread {split})" if split else ""


def _split(before: tuple[int, int] | None, after: tuple[int, int] | None) -> str:
    """How long a thread waited for a core and ran on one between two of its readings."""
    if before is None or after is None:
        return ""
    return (
        f"waited {(after[1] - before[1]) / 1e6:.1f} ms for a core,"
        f" ran {(after[0] - before[0]) / 1e6:.1f} ms"
    )


_pausing = 0  # collector_paused blocks in progress


@contextlib.contextmanager
def collector_paused(*, freeze: bool = False) -> Iterator[None]:
    """The cyclic collector off while the block runs (blocks may nest and interleave across
    tasks: it resumes when the last ends). For bulk work that builds long-lived objects, a
    broker taking over or handing over thousands of partitions: there every young collection
    walks what it just built and frees nothing, a tenth of the work on two cores. With
    ``freeze``, what exists when the last block ends is moved out of the collector's reach
    (as at startup) instead of walked by the first collection after, which would hold the
    event loop for as long as the objects made meanwhile are many; cycles made meanwhile are
    then never collected, so freeze only after work that makes few."""
    global _pausing
    if _pausing == 0:
        gc.disable()
    _pausing += 1
    try:
        yield
    finally:
        _pausing -= 1
        if _pausing == 0:
            if freeze:
                gc.freeze()
            gc.enable()


class CollectorPauses:
    """How long the cyclic garbage collector held the interpreter, per generation. While it
    runs nothing else does: not the event loop, not the WAL writer thread waiting for the GIL
    after its write. A collection's time grows with the tracked objects it walks."""

    def __init__(self, window: int = WINDOW, *, freeze_survivors: bool = False) -> None:
        self.pauses: tuple[deque[float], ...] = tuple(deque(maxlen=window) for _ in range(3))
        self.counts = [0, 0, 0]
        self.freeze_survivors = freeze_survivors
        self.freezes = 0  # times a slow full collection's survivors were frozen
        self._started = 0.0
        # at DEBUG: the collecting thread's scheduler counters when the collection started
        self._times: tuple[int, int] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        """Count collections from now on (on the event loop: the freezes run there)."""
        with contextlib.suppress(RuntimeError):
            self._loop = asyncio.get_running_loop()
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def stop(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._times = _this_thread_times() if log.isEnabledFor(logging.DEBUG) else None
            self._started = time.perf_counter()
            return
        generation = info["generation"]
        pause = time.perf_counter() - self._started
        self.pauses[generation].append(pause)
        self.counts[generation] += 1
        if pause >= DEBUG_COLLECTION_S:
            # at DEBUG, where the time went (a collection that frees cycles holding large
            # buffers spends it handing memory back, off the CPU and not waiting for it)
            split = _split(self._times, _this_thread_times())
            where = f"; thread {threading.current_thread().name} {split}" if split else ""
            log.log(
                logging.INFO if pause >= SLOW_COLLECTION_S else logging.DEBUG,
                "a generation-%d garbage collection held the interpreter for %.1f ms "
                "(%d objects freed%s)",
                generation,
                pause * 1000,
                info["collected"],
                where,
            )
        if (
            self.freeze_survivors
            and generation == 2
            and pause >= FREEZE_AFTER_S
            and info["collected"] <= FREEZE_MAX_FREED
            and self._loop is not None
        ):
            # not from inside the collector's callback (any thread's): on the loop, next pass
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._freeze)

    def _freeze(self) -> None:
        """Move every tracked object out of the collector's reach: the next full collections
        walk only what is made from now on. Cycles among frozen objects that later become
        garbage are never collected; objects that live as long as the broker make few."""
        before = gc.get_freeze_count()
        gc.freeze()
        self.freezes += 1
        log.debug(
            "a slow full collection freed little: the %d objects it walked frozen",
            gc.get_freeze_count() - before,
        )

    def summary(self) -> str:
        parts = []
        for generation, pauses in enumerate(self.pauses):
            ordered = sorted(pauses)
            if not ordered:
                parts.append(f"gen{generation} 0")
                continue
            parts.append(
                f"gen{generation} {self.counts[generation]} "
                f"(p99 {nearest_rank(ordered, 99) * 1000:.1f} ms, "
                f"max {ordered[-1] * 1000:.1f} ms)"
            )
        return "garbage collector pauses: " + ", ".join(parts)

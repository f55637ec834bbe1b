"""The event loop's thread kept on one CPU (``event.loop.pin.cpu``), moved when it is crowded.

Why: where the broker shares a small machine with its clients, the kernel wakes the reader of
a socket on the writer's CPU (a "sync" wake-up: the writer is expected to sleep next). When
librdkafka's I/O thread sends a Produce request, the event loop is woken on that thread's CPU,
and the loop's few hundred microseconds of Python then hold that thread off its CPU, while the
other core idles: its next requests wait, unsent, and the records behind them wait past
``linger.ms``. With the loop's thread on a CPU of its own the client's threads are woken
elsewhere (bench/README.md, "Where the time goes").

:class:`LoopCpu` pins the loop's thread to the CPU it runs on. Every ``interval_s`` it reads how
long the thread waited for that CPU (``/proc/thread-self/schedstat``); past ``crowded_share`` of
the interval another thread is crowding it, and the thread is let go on every CPU it may use,
to be pinned again, where the scheduler has put it, at the next look (:func:`next_step`).

A thread or process inherits the CPUs of the thread that starts it: the thread pool of
:func:`widen_thread` and the children :func:`spawning` starts take the process's CPUs, not the
loop's one. The kernel's io_uring workers that the loop's WAL commits wake take the loop's CPU
(they copy each commit into the page cache, which the write's completion waits for anyway), so
the client's threads are spared their real-time priority.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
from collections.abc import Iterator

log = logging.getLogger("automq.loop_cpu")

INTERVAL_S = 1.0
# a pinned loop that waited this share of an interval for its CPU is moved. At 20 MB/s beside
# the bench's client on 2 cores it waits 25-80 ms a second, most of it for the io_uring's
# worker, which copies each WAL commit on the loop's CPU at real-time priority; a busy loop
# beside a busy process bound to its CPU passes a quarter in its first interval (the tests).
CROWDED_SHARE = 0.25

# while the loop's thread is pinned: the CPUs the process may use, for what the loop starts
_wide: frozenset[int] | None = None


class Step(enum.Enum):
    STAY = "stay"
    PIN = "pin"  # to the CPU the thread is on
    RELEASE = "release"  # to every CPU the process may use


def next_step(pinned: bool, waited_s: float, interval_s: float, crowded_share: float) -> Step:
    """What to do after an interval in which the loop's thread waited ``waited_s`` for a CPU:
    a pinned thread that waited ``crowded_share`` of it or more is let go; one let go is
    pinned again where it runs now."""
    if not pinned:
        return Step.PIN
    if waited_s >= crowded_share * interval_s:
        return Step.RELEASE
    return Step.STAY


def parse_wait_s(schedstat: str) -> float:
    """Seconds the thread has waited on a run queue, from its ``schedstat`` (run time, wait
    time, time slices; nanoseconds)."""
    return int(schedstat.split()[1]) / 1e9


def parse_cpu(stat: str) -> int:
    """The CPU the thread last ran on, from its ``stat`` (field 39, ``processor``; the name
    in field 2 is in parentheses and may hold spaces)."""
    return int(stat[stat.rindex(")") + 2 :].split()[36])


def widen_thread() -> None:
    """Let the calling thread run on every CPU the process may use (a thread pool's
    initializer: its threads are started by the loop's thread, and would share its CPU)."""
    wide = _wide
    if wide is not None:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, wide)


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Around starting a child process (or a thread) from the loop's thread: the child takes
    the process's CPUs, and the loop keeps its own."""
    wide = _wide
    if wide is None:
        yield
        return
    own = os.sched_getaffinity(0)
    if own == wide:
        yield
        return
    os.sched_setaffinity(0, wide)
    try:
        yield
    finally:
        os.sched_setaffinity(0, own)


class LoopCpu:
    """Keeps the calling event loop's thread on one CPU while no other thread crowds it."""

    def __init__(
        self, interval_s: float = INTERVAL_S, crowded_share: float = CROWDED_SHARE
    ) -> None:
        self.interval_s = interval_s
        self.crowded_share = crowded_share
        self.cpu: int | None = None  # the CPU the thread is pinned to; None while let go
        self.moves = 0  # times it was let go because its CPU was crowded
        self.most_waited_s = 0.0  # the longest wait for its CPU in an interval while pinned
        self._wide: frozenset[int] = frozenset()
        self._waited = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> bool:
        """Pin the thread (call on the loop's thread); False where it cannot be: one CPU to
        run on, or no ``sched_setaffinity`` or ``/proc`` (not Linux)."""
        global _wide
        try:
            wide = frozenset(os.sched_getaffinity(0))
            waited = self._read_wait()
        except (AttributeError, OSError, ValueError, IndexError) as e:
            log.info("event loop not pinned to a CPU (event.loop.pin.cpu): %s", e)
            return False
        if len(wide) < 2:
            log.debug("event loop not pinned: the process may run on CPU %s only", set(wide))
            return False
        self._wide, self._waited = wide, waited
        failure = self._pin()
        if failure is not None:
            log.info("event loop not pinned to a CPU (event.loop.pin.cpu): %s", failure)
            return False
        _wide = wide
        log.info(
            "event loop pinned to CPU %d of %s; moved when another thread crowds it "
            "(event.loop.pin.cpu)",
            self.cpu,
            sorted(wide),
        )
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._look)
        return True

    def stop(self) -> None:
        """Let the thread run on every CPU again (on the loop's thread)."""
        global _wide
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            log.info(
                "event loop's CPU: waited for it at most %.1f ms in %.1f s while pinned; "
                "moved %d times",
                self.most_waited_s * 1000,
                self.interval_s,
                self.moves,
            )
        if self._wide:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self._wide)
        self.cpu = None
        _wide = None

    def _look(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.interval_s, self._look)
        try:
            waited = self._read_wait()
        except (OSError, ValueError, IndexError):
            return
        interval_waited, self._waited = waited - self._waited, waited
        if self.cpu is not None:
            self.most_waited_s = max(self.most_waited_s, interval_waited)
        step = next_step(self.cpu is not None, interval_waited, self.interval_s, self.crowded_share)
        if step is Step.RELEASE:
            self.moves += 1
            log.debug(
                "event loop waited %.0f ms of the last %.1f s for CPU %s: letting it move",
                interval_waited * 1000,
                self.interval_s,
                self.cpu,
            )
            self.cpu = None
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, self._wide)
        elif step is Step.PIN:
            self._pin()
            log.debug("event loop pinned to CPU %s", self.cpu)

    def _pin(self) -> Exception | None:
        """Pin the thread to the CPU it runs on; what prevented it, if anything."""
        self.cpu = None
        try:
            cpu = self._read_cpu()
            if cpu not in self._wide:
                return ValueError(f"it runs on CPU {cpu}, outside {sorted(self._wide)}")
            os.sched_setaffinity(0, {cpu})
        except (OSError, ValueError, IndexError) as e:
            return e
        self.cpu = cpu
        return None

    @staticmethod
    def _read_wait() -> float:
        with open("/proc/thread-self/schedstat") as f:
            return parse_wait_s(f.read())

    @staticmethod
    def _read_cpu() -> int:
        with open("/proc/thread-self/stat") as f:
            return parse_cpu(f.read())

"""LoopCpu: the event loop's thread pinned to the CPU it runs on, let go when another thread
crowds that CPU and pinned again where it lands; what the loop's thread starts meanwhile runs
on the process's CPUs. The pure rules first, then the real thing on this machine's CPUs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from storage import child_process, loop_cpu
from storage.loop_cpu import LoopCpu, Step, next_step, parse_cpu, parse_wait_s

CPUS = os.sched_getaffinity(0)  # two or more: the machines the suite runs on have two cores


def _allowed(pid: int, tid: int | None = None) -> set[int]:
    """The CPUs a thread may run on, from its ``status`` (``Cpus_allowed_list``: 0-1,3)."""
    path = f"/proc/{pid}/task/{tid or pid}/status"
    with open(path) as f:
        line = next(line for line in f if line.startswith("Cpus_allowed_list:"))
    cpus: set[int] = set()
    for part in line.split(":", 1)[1].strip().split(","):
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def test_a_pinned_thread_stays_until_it_waits_a_crowded_share_for_its_cpu() -> None:
    assert next_step(True, 0.05, 1.0, 0.25) is Step.STAY
    assert next_step(True, 0.249, 1.0, 0.25) is Step.STAY
    assert next_step(True, 0.25, 1.0, 0.25) is Step.RELEASE
    assert next_step(True, 0.6, 2.0, 0.25) is Step.RELEASE
    # let go: pinned again at the next look, wherever it runs by then
    assert next_step(False, 0.9, 1.0, 0.25) is Step.PIN
    assert next_step(False, 0.0, 1.0, 0.25) is Step.PIN


def test_the_wait_and_the_cpu_are_read_from_the_threads_proc_files() -> None:
    assert parse_wait_s("8149120306 1250000000 42103\n") == 1.25
    # the name may hold spaces and parentheses; the CPU is field 39
    fields = ["S"] + [str(n) for n in range(4, 39)] + ["3"] + ["0"] * 13
    assert parse_cpu("4242 (a (b) c) " + " ".join(fields) + "\n") == 3
    with open("/proc/thread-self/stat") as f:
        assert parse_cpu(f.read()) in CPUS
    with open("/proc/thread-self/schedstat") as f:
        assert parse_wait_s(f.read()) >= 0


async def test_start_pins_the_thread_to_its_cpu_and_stop_lets_it_go() -> None:
    pinned = LoopCpu()
    try:
        assert pinned.start()
        assert pinned.cpu is not None
        assert os.sched_getaffinity(0) == {pinned.cpu}
    finally:
        pinned.stop()
    assert os.sched_getaffinity(0) == CPUS
    assert pinned.cpu is None


async def test_what_the_pinned_thread_starts_runs_on_every_cpu() -> None:
    pinned = LoopCpu()
    try:
        assert pinned.start()
        child = await child_process.spawn(
            [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=child_process.PIPE
        )
        try:
            assert _allowed(child.pid) == CPUS
        finally:
            child.kill()
            await child.wait()
        with ThreadPoolExecutor(1, initializer=loop_cpu.widen_thread) as pool:
            assert pool.submit(os.sched_getaffinity, 0).result() == CPUS
        with loop_cpu.spawning():
            assert os.sched_getaffinity(0) == CPUS
        assert os.sched_getaffinity(0) == {pinned.cpu}  # the loop keeps its own
    finally:
        pinned.stop()
    with ThreadPoolExecutor(1, initializer=loop_cpu.widen_thread) as pool:
        assert pool.submit(os.sched_getaffinity, 0).result() == CPUS


async def test_a_loop_crowded_on_its_cpu_is_let_go_and_pinned_again_elsewhere() -> None:
    # a busy process bound to the loop's CPU: the loop, kept busy too, waits for it about half
    # of each look's interval, is let go, and is pinned again on a CPU the process is not on
    pinned = LoopCpu(interval_s=0.2)
    busy: subprocess.Popen[bytes] | None = None
    try:
        assert pinned.start()
        crowded = pinned.cpu
        busy = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import os; os.sched_setaffinity(0, {{{crowded}}})\nwhile 1: pass",
            ]
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (pinned.moves == 0 or pinned.cpu in (None, crowded)):
            started = time.thread_time()
            while time.thread_time() - started < 0.01:  # the loop's own work
                pass
            await asyncio.sleep(0)
        assert pinned.moves >= 1
        assert pinned.cpu is not None and pinned.cpu != crowded
        assert os.sched_getaffinity(0) == {pinned.cpu}
    finally:
        pinned.stop()
        if busy is not None:
            busy.kill()
            busy.wait()
    assert os.sched_getaffinity(0) == CPUS


async def test_a_thread_with_one_cpu_to_run_on_is_not_pinned() -> None:
    one = {min(CPUS)}
    os.sched_setaffinity(0, one)
    try:
        pinned = LoopCpu()
        assert not pinned.start()
        pinned.stop()
        assert os.sched_getaffinity(0) == one
        with loop_cpu.spawning():  # nothing pinned: nothing widened
            assert os.sched_getaffinity(0) == one
    finally:
        os.sched_setaffinity(0, CPUS)

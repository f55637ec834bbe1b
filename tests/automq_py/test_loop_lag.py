"""The event-loop lag monitor sees a loop held by blocking code; the collector's pauses are
counted per generation."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from automq_py import loop_lag
from automq_py.broker import Broker
from automq_py.config import BrokerConfig, ConfigError
from automq_py.loop_lag import CollectorPauses, LoopLagMonitor, collector_paused


async def test_a_blocked_loop_shows_as_lag() -> None:
    monitor = LoopLagMonitor(interval_s=0.005)
    monitor.start()
    await asyncio.sleep(0.1)
    quiet = monitor.percentiles()
    time.sleep(0.2)  # holds the loop
    await asyncio.sleep(0.05)
    await monitor.stop()
    assert quiet["max"] < 150
    assert monitor.percentiles()["max"] >= 150
    assert "p99" in monitor.summary()


async def test_a_stall_is_logged_at_debug_as_it_happens(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LoopLagMonitor(interval_s=0.005)
    with caplog.at_level(logging.DEBUG, logger="automq.loop"):
        monitor.start()
        await asyncio.sleep(0.05)
        time.sleep(0.03)  # holds the loop
        await asyncio.sleep(0.05)
        await monitor.stop()
    late = [r.getMessage() for r in caplog.records if "ran" in r.getMessage()]
    assert late and all(m.startswith("the event loop ran ") for m in late)
    assert max(float(m.split()[4]) for m in late) >= 25
    assert all(" ms for a core, ran " in m for m in late)  # Linux's scheduler statistics


def _hold_the_loop_in_a_named_place(seconds: float) -> None:
    time.sleep(seconds)  # a blocking call, as a synchronous write or a lock would be


async def test_a_stall_logs_where_the_loop_was_held(caplog: pytest.LogCaptureFixture) -> None:
    monitor = LoopLagMonitor(interval_s=0.005)
    with caplog.at_level(logging.DEBUG, logger="automq.stalls"):
        monitor.start()
        await asyncio.sleep(0.05)
        _hold_the_loop_in_a_named_place(0.08)
        await asyncio.sleep(0.05)
        _hold_the_loop_in_a_named_place(0.08)
        await asyncio.sleep(0.05)
        await monitor.stop()
    held = [r.getMessage() for r in caplog.records if r.name == "automq.stalls"]
    # one line a stall (not one per check while it lasts), naming the function and the caller
    assert len(held) == 2, held
    for message in held:
        assert message.startswith("the event loop has been held ")
        assert float(message.split()[6]) >= loop_lag.STACK_STALL_S * 1000
        first = message.split(": ", 1)[1].split(" <- ")
        assert first[0].startswith("_hold_the_loop_in_a_named_place (")
        assert "test_a_stall_logs_where_the_loop_was_held" in first[1]


async def test_without_the_stalls_logger_at_debug_no_sampler_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    monitor = LoopLagMonitor(interval_s=0.005)
    with caplog.at_level(logging.INFO, logger="automq.stalls"):
        monitor.start()
        names = {t.name for t in threading.enumerate()}
        _hold_the_loop_in_a_named_place(0.05)
        await asyncio.sleep(0.02)
        await monitor.stop()
    assert "stall-sampler" not in names
    assert not [r for r in caplog.records if r.name == "automq.stalls"]


async def test_a_stall_on_a_busy_core_says_how_long_it_waited_for_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the loop's thread and a busy process share one core: work of 60 ms on the loop's
    # thread takes about twice that, half of it waiting for the core
    core = min(os.sched_getaffinity(0))
    allowed = os.sched_getaffinity(0)
    busy = subprocess.Popen(
        [sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{core}}})\nwhile 1: pass"]
    )
    monitor = LoopLagMonitor(interval_s=0.005)
    try:
        os.sched_setaffinity(0, {core})
        with caplog.at_level(logging.DEBUG, logger="automq.loop"):
            monitor.start()
            await asyncio.sleep(0.3)
            started = time.thread_time()
            while time.thread_time() - started < 0.06:
                pass
            await asyncio.sleep(0.05)
            await monitor.stop()
    finally:
        os.sched_setaffinity(0, allowed)
        busy.kill()
        busy.wait()
    waited = [
        float(m.split("waited ")[1].split()[0])
        for m in (r.getMessage() for r in caplog.records)
        if "waited" in m
    ]
    assert max(waited) >= 20


def test_no_samples_reads_as_zero() -> None:
    assert LoopLagMonitor().percentiles() == {"p50": 0.0, "p99": 0.0, "max": 0.0}


def test_collections_are_counted_per_generation_and_slow_ones_logged(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pauses = CollectorPauses()
    assert pauses.summary() == "garbage collector pauses: gen0 0, gen1 0, gen2 0"
    pauses.start()
    pauses.start()  # once only
    try:
        gc.collect(0)
        gc.collect(2)
        monkeypatch.setattr(loop_lag, "SLOW_COLLECTION_S", 0.0)
        monkeypatch.setattr(loop_lag, "DEBUG_COLLECTION_S", 0.0)
        with caplog.at_level(logging.INFO, logger="automq.loop"):
            gc.collect(1)
        with caplog.at_level(logging.DEBUG, logger="automq.loop"):
            gc.collect(0)
    finally:
        pauses.stop()
    counted = list(pauses.counts)
    gc.collect(2)  # stopped: not counted
    assert pauses.counts == counted and min(counted) >= 1  # (automatic ones may add to it)
    assert "gen2 1 (p99 " in pauses.summary()
    assert "a generation-1 garbage collection held the interpreter" in caplog.text
    # at DEBUG the line says which thread collected and where its time went
    [debug] = [r.getMessage() for r in caplog.records if "generation-0" in r.getMessage()]
    assert re.search(r"objects freed; thread MainThread waited [0-9.]+ ms for a core, ran ", debug)


async def test_a_broker_that_fails_to_start_takes_its_monitors_back(tmp_path: Path) -> None:
    config = BrokerConfig.load(
        None,
        [
            f"log.dirs={tmp_path}",
            "group.min.session.timeout.ms=60000",
            "group.max.session.timeout.ms=6000",
        ],
    )
    broker = Broker(config)
    callbacks = list(gc.callbacks)
    with pytest.raises(ConfigError, match=r"group\.min\.session\.timeout\.ms"):
        await broker.start()
    assert gc.callbacks == callbacks
    assert broker.loop_lag._task is None


def test_collector_paused_resumes_after_the_last_of_interleaved_blocks() -> None:
    assert gc.isenabled()
    first = collector_paused()
    second = collector_paused()
    first.__enter__()
    second.__enter__()
    assert not gc.isenabled()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second block still runs
    second.__exit__(None, None, None)
    assert gc.isenabled()


def test_collector_paused_with_freeze_moves_what_was_built_out_of_reach() -> None:
    frozen = gc.get_freeze_count()
    try:
        with collector_paused(freeze=True):
            built = [[i] for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= frozen + len(built)
    finally:
        gc.unfreeze()


def test_collector_paused_resumes_when_the_block_raises() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


async def test_a_slow_full_collection_that_frees_little_freezes_what_it_walked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Objects that outlive a slow full collection are frozen once it is over (on the loop),
    and the next full collection no longer walks them; one that freed much is left alone."""
    monkeypatch.setattr(loop_lag, "FREEZE_AFTER_S", 0.0)
    gc.collect()  # the garbage the test session left, first
    pauses = CollectorPauses(freeze_survivors=True)
    pauses.start()
    kept = [{"n": i} for i in range(50_000)]  # tracked, long-lived
    try:
        gc.collect(2)
        await asyncio.sleep(0)  # the freeze runs on the loop's next pass
        await asyncio.sleep(0)
        assert pauses.freezes >= 1
        assert gc.get_freeze_count() >= len(kept)
        monkeypatch.setattr(loop_lag, "FREEZE_MAX_FREED", 10)
        freezes = pauses.freezes
        for _ in range(1000):  # garbage: cycles only a collection frees
            cycle: list[object] = []
            cycle.append(cycle)
        del cycle
        gc.collect(2)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        assert pauses.freezes == freezes
    finally:
        pauses.stop()
        gc.unfreeze()  # the rest of the test session collects as before
    assert kept

"""The event-loop lag monitor sees a loop held by blocking code."""

from __future__ import annotations

import asyncio
import time

from automq_py.loop_lag import LoopLagMonitor


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


def test_no_samples_reads_as_zero() -> None:
    assert LoopLagMonitor().percentiles() == {"p50": 0.0, "p99": 0.0, "max": 0.0}

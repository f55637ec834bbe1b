"""OwnTime: a request's own handling time, which a request quota counts (Kafka's time on the
handler threads), without the time it waits."""

from __future__ import annotations

import asyncio
import time

import pytest

from automq_py.apis import OwnTime


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def test_the_waits_are_not_counted_and_the_result_comes_through() -> None:
    async def handler() -> str:
        _busy(0.02)
        await asyncio.sleep(0.3)
        _busy(0.02)
        await asyncio.sleep(0)
        return "answer"

    timed = OwnTime(handler())
    assert await timed == "answer"
    assert 35 <= timed.ms < 150, timed.ms


async def test_an_error_comes_through_with_the_time_until_it() -> None:
    async def handler() -> None:
        await asyncio.sleep(0.05)
        _busy(0.02)
        raise ValueError("bad request")

    timed = OwnTime(handler())
    with pytest.raises(ValueError, match="bad request"):
        await timed
    assert 15 <= timed.ms < 45, timed.ms


async def test_a_cancellation_reaches_the_handler() -> None:
    cleaned: list[bool] = []

    async def handler() -> None:
        try:
            await asyncio.sleep(10)
        finally:
            cleaned.append(True)

    timed = OwnTime(handler())
    task = asyncio.ensure_future(timed)
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == [True]

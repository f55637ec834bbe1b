"""gather_eagerly: asyncio.gather's results and failures, with no task for what never waits."""

from __future__ import annotations

import asyncio

import pytest

from storage.eager import gather_eagerly


async def _value(v: int) -> int:
    return v


async def _after(fut: asyncio.Future[int], add: int) -> int:
    return await fut + add


async def _fails(message: str) -> int:
    raise ValueError(message)


def test_results_in_order_without_tasks() -> None:
    async def main() -> tuple[list[int], int]:
        before = len(asyncio.all_tasks())
        results = await gather_eagerly(_value(1), _value(2), _value(3))
        return results, len(asyncio.all_tasks()) - before

    results, extra_tasks = asyncio.run(main())
    assert results == [1, 2, 3]
    assert extra_tasks == 0


def test_waiting_coroutines_go_on_concurrently() -> None:
    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        a: asyncio.Future[int] = loop.create_future()
        b: asyncio.Future[int] = loop.create_future()
        # b resolves first: each waits on its own, neither holds the other up
        loop.call_later(0.02, a.set_result, 10)
        loop.call_later(0.01, b.set_result, 20)
        return await gather_eagerly(_after(a, 1), _value(5), _after(b, 2))

    assert asyncio.run(main()) == [11, 5, 22]


def test_a_bare_yield_and_a_sleep_are_waited_out() -> None:
    async def sleeps() -> str:
        await asyncio.sleep(0)
        await asyncio.sleep(0.001)
        return "slept"

    assert asyncio.run(gather_eagerly(sleeps(), _value(7))) == ["slept", 7]


def test_first_failure_raised_the_others_run_on() -> None:
    async def main() -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        later = _after(fut, 1)
        with pytest.raises(ValueError, match="now") as failed:
            await gather_eagerly(_fails("now"), later)
        # the waiting one was started and runs to its end, not left unawaited
        fut.set_result(41)
        for _ in range(3):
            await asyncio.sleep(0)
        return str(failed.value), fut.result()

    assert asyncio.run(main()) == ("now", 41)


def test_a_failure_after_waiting_is_raised() -> None:
    async def fails_later() -> int:
        await asyncio.sleep(0)
        raise KeyError("late")

    async def main() -> None:
        with pytest.raises(KeyError, match="late"):
            await gather_eagerly(_value(1), fails_later())

    asyncio.run(main())


def test_cancelling_the_caller_cancels_the_waits() -> None:
    cancelled: list[str] = []

    async def waits(fut: asyncio.Future[int]) -> int:
        try:
            return await fut
        except asyncio.CancelledError:
            cancelled.append("waits")
            raise

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        caller = asyncio.ensure_future(gather_eagerly(_value(1), waits(fut)))
        await asyncio.sleep(0.01)
        caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        return fut.cancelled()

    assert asyncio.run(main()) is True
    assert cancelled == ["waits"]


def test_exception_thrown_in_reaches_the_coroutine() -> None:
    """A future that fails reaches the coroutine where it awaits it, and it may handle it."""

    async def recovers(fut: asyncio.Future[int]) -> int:
        try:
            return await fut
        except OSError:
            return -1

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        loop.call_soon(fut.set_exception, OSError("gone"))
        return await gather_eagerly(recovers(fut), _value(2))

    assert asyncio.run(main()) == [-1, 2]

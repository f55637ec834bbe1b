"""gather_eagerly: asyncio.gather's results, failures and cancellation, with no task for what never
waits."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from storage.eager import gather_eagerly


async def _value(v: int) -> int:
    return v


async def _after(fut: asyncio.Future[int], add: int, finished: list[int] | None = None) -> int:
    value = await fut + add
    if finished is not None:
        finished.append(value)
    return value


async def _fails(message: str) -> int:
    raise ValueError(message)


def _counting_tasks(created: list[str]) -> None:
    """Count the tasks the running loop makes from here on."""

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        created.append(type(coro).__name__)
        return asyncio.Task(coro, loop=loop, **kwargs)

    asyncio.get_running_loop().set_task_factory(factory)


def test_what_never_waits_costs_no_task() -> None:
    async def main() -> tuple[list[int], list[str]]:
        created: list[str] = []
        _counting_tasks(created)
        results = await gather_eagerly(_value(1), _value(2), _value(3))
        return results, list(created)  # (asyncio.run's shutdown makes tasks of its own after)

    results, created = asyncio.run(main())
    assert results == [1, 2, 3]
    assert created == []


def test_only_what_waits_gets_a_task() -> None:
    async def main() -> tuple[list[int], int]:
        created: list[str] = []
        _counting_tasks(created)
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(fut.set_result, 40)
        results = await gather_eagerly(_value(1), _after(fut, 2), _value(3))
        return results, len(created)

    assert asyncio.run(main()) == ([1, 42, 3], 1)


def test_waiting_coroutines_go_on_concurrently() -> None:
    async def main() -> tuple[list[int], list[int]]:
        loop = asyncio.get_running_loop()
        a: asyncio.Future[int] = loop.create_future()
        b: asyncio.Future[int] = loop.create_future()
        # b resolves first: were they run one after the other, a's would finish first
        loop.call_later(0.02, a.set_result, 10)
        loop.call_later(0.01, b.set_result, 20)
        finished: list[int] = []
        results = await gather_eagerly(_after(a, 1, finished), _value(5), _after(b, 2, finished))
        return results, finished

    assert asyncio.run(main()) == ([11, 5, 22], [22, 11])


def test_a_bare_yield_and_a_sleep_are_waited_out() -> None:
    async def sleeps() -> int:
        await asyncio.sleep(0)
        await asyncio.sleep(0.001)
        return 6

    assert asyncio.run(gather_eagerly(sleeps(), _value(7))) == [6, 7]


def test_first_failure_raised_the_others_started_and_run_on() -> None:
    async def main() -> tuple[str, list[int]]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        finished: list[int] = []
        with pytest.raises(ValueError, match="now") as failed:
            # the failure comes first: the coroutines after it still start (none left unawaited)
            await gather_eagerly(_fails("now"), _after(fut, 1, finished))
        fut.set_result(41)
        for _ in range(3):
            await asyncio.sleep(0)
        return str(failed.value), finished

    assert asyncio.run(main()) == ("now", [42])


def test_a_failure_after_waiting_is_raised() -> None:
    async def fails_later() -> int:
        await asyncio.sleep(0)
        raise KeyError("late")

    async def main() -> None:
        with pytest.raises(KeyError, match="late"):
            await gather_eagerly(_value(1), fails_later())

    asyncio.run(main())


class _Waits:
    """A coroutine that waits on ``fut`` and notes how it ended."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    async def __call__(self, fut: asyncio.Future[int]) -> int:
        try:
            return await fut
        except BaseException as e:
            self.ended.append(type(e).__name__)
            raise
        finally:
            await asyncio.sleep(0)  # cleanup that itself waits: only a task can run it


def _cancelled_caller(make: Any, cancel_at_once: bool) -> tuple[bool, bool]:
    """Cancel a caller of gather_eagerly(make(fut)): queued before the continuation's task first
    runs, or once it waits. Returns whether the caller and ``fut`` ended cancelled."""

    async def main() -> tuple[bool, bool]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()
        coro: Coroutine[Any, Any, int] = make(fut)
        caller = asyncio.ensure_future(gather_eagerly(_value(1), coro))
        if cancel_at_once:
            loop.call_soon(caller.cancel)
        else:
            await asyncio.sleep(0.01)
            caller.cancel()
        with pytest.raises(asyncio.CancelledError):
            await caller
        for _ in range(3):
            await asyncio.sleep(0)
        return caller.cancelled(), fut.cancelled()

    return asyncio.run(main())


@pytest.mark.parametrize("cancel_at_once", [False, True], ids=["while-waiting", "before-task-ran"])
def test_cancelling_the_caller_cancels_the_waits(cancel_at_once: bool) -> None:
    waits = _Waits()
    assert _cancelled_caller(waits, cancel_at_once) == (True, True)
    # CancelledError, once, where it waited, and its cleanup ran in the task (no GeneratorExit)
    assert waits.ended == ["CancelledError"]


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

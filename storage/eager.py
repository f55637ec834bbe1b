"""``gather_eagerly``: ``asyncio.gather`` that runs each coroutine at once, in the caller's task,
until it first waits, and makes a task only of the ones that do.

A consumer's Fetch reads its partitions concurrently, since a cold read waits for object storage,
but a read from the LogCache never waits. ``asyncio.gather`` made a task of each coroutine all
the same: sixteen a fetch of eight partitions (opened, then read), each a pass of the event loop
before it ran and a callback after. That was a quarter of the event loop's CPU a fetch from
the LogCache (``bench/fetch_path.py``: 202 against 152 us), on the path of the consumer's next
request. Python 3.12's eager task factory does the same for every task; this is the part of it
the broker needs, on 3.11 too.

A coroutine that waits goes on in a task of its own from where it stopped: the future it waits on
is handed to the task as if the task had started it, so cancelling the task cancels that wait and
reaches the coroutine as ``CancelledError``, as with any task, even before the task first runs.

Each coroutine's first step runs in the caller's task and context, not in a copy: one that sets a
context variable, or enters ``asyncio.timeout()``, before it first waits is not one to hand it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


async def gather_eagerly(*coros: Coroutine[Any, Any, T]) -> list[T]:
    """The coroutines' results in order, as ``asyncio.gather``: the first failure is raised and
    the others run on (their failures observed, not logged as unretrieved)."""
    results: list[Any] = [None] * len(coros)
    pending: dict[int, asyncio.Future[T]] = {}
    failure: BaseException | None = None
    for i, coro in enumerate(coros):
        try:
            waits_on = coro.send(None)
        except StopIteration as done:
            results[i] = done.value
        except BaseException as e:  # as gather: the first failure is the caller's
            if failure is None:
                failure = e
        else:
            pending[i] = asyncio.ensure_future(_Continued(coro, waits_on))
    if failure is not None:
        for task in pending.values():
            task.add_done_callback(_observe)
        raise failure
    if pending:
        for i, value in zip(pending, await asyncio.gather(*pending.values()), strict=True):
            results[i] = value
    return results


class _Continued(Coroutine[Any, Any, T]):
    """``coro`` continued, in a task, from the point where it yielded ``waits_on`` (a future, or
    None for a bare yield): the task's first step gets ``waits_on``, and everything sent or thrown
    after goes to ``coro``. A throw before that first step (the task cancelled before it ran)
    reaches ``coro`` too, with the future it waits on cancelled, as ``Task.cancel`` would have."""

    __slots__ = ("_coro", "_waits_on", "_waits_on_unsent")

    def __init__(self, coro: Coroutine[Any, Any, T], waits_on: Any) -> None:
        self._coro = coro
        self._waits_on: Any = waits_on
        self._waits_on_unsent = True

    def send(self, value: Any) -> Any:
        if self._waits_on_unsent:
            self._waits_on_unsent = False
            return self._waits_on
        return self._coro.send(value)

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        if self._waits_on_unsent:
            self._waits_on_unsent = False
            if isinstance(self._waits_on, asyncio.Future):
                self._waits_on.cancel()
        if val is None and tb is None:
            return self._coro.throw(typ)
        return self._coro.throw(typ, val, tb)  # (the older three-argument form)

    def close(self) -> None:
        self._coro.close()

    def __await__(self) -> Generator[Any, None, T]:
        return self._coro.__await__()  # (never awaited: a task drives it by send and throw)


def _observe(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()

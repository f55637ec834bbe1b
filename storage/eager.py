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
reaches the coroutine as ``CancelledError``, as with any task.
"""

from __future__ import annotations

import asyncio
import types
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
            pending[i] = asyncio.ensure_future(_go_on(coro, waits_on))
    if failure is not None:
        for task in pending.values():
            task.add_done_callback(_observe)
        raise failure
    if pending:
        for i, value in zip(pending, await asyncio.gather(*pending.values()), strict=True):
            results[i] = value
    return results


async def _go_on(coro: Coroutine[Any, Any, T], waits_on: Any) -> T:
    return await _resume(coro, waits_on)


@types.coroutine
def _resume(coro: Coroutine[Any, Any, T], waits_on: Any) -> Generator[Any, Any, T]:
    """Drive ``coro`` on from the point where it yielded ``waits_on`` (a future, or None for a
    bare yield), as ``await`` would have: what the task sends or throws goes to ``coro``."""
    while True:
        try:
            sent = yield waits_on
        except GeneratorExit:
            coro.close()
            raise
        except BaseException as e:  # thrown in by the task: the coroutine's to handle
            try:
                waits_on = coro.throw(e)
            except StopIteration as done:
                return done.value
        else:
            try:
                waits_on = coro.send(sent)
            except StopIteration as done:
                return done.value


def _observe(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()

"""Deferred: a handler's response that is still to come.

A handler that has done the part of its work that must happen in request order (Produce: the
appends started) returns ``Deferred(future, finish)``: the connection goes on reading and
handling its next requests, and once ``future`` is done, ``finish(its result)`` is the
handler's result. KafkaApis hands the socket server a :class:`PendingResponse`, which the
connection's response queue encodes and writes, in request order, from ``future``'s own done
callback. Callbacks on the one future, not a task per request nor a future per step: between
a WAL commit and the response going out, each would be one more pass of the event loop,
behind whatever else is ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Deferred(Generic[T]):
    """``listeners``: a list the maker of ``future`` calls, right after setting it done (with a
    result, an exception, or cancelled: every time), in the same pass of the event loop; the
    response's writer joins it (a done callback of the future would run a pass later, behind
    the requests read meanwhile). None: it has none."""

    __slots__ = ("finish", "future", "listeners")

    def __init__(
        self,
        future: asyncio.Future[T],
        finish: Callable[[T], Any],
        listeners: list[Callable[[], object]] | None = None,
    ) -> None:
        self.future = future
        self.finish = finish
        self.listeners = listeners


class PendingResponse:
    """A response to write once ``future`` is done: ``response()`` then encodes it (or the
    error response), or raises what no response can say (the connection closes)."""

    __slots__ = ("_make", "future", "listeners")

    def __init__(
        self,
        future: asyncio.Future[Any],
        make: Callable[[], Any],
        listeners: list[Callable[[], object]] | None = None,
    ) -> None:
        self.future = future
        self._make = make
        self.listeners = listeners  # see Deferred

    def response(self) -> Any:
        return self._make()

"""Deferred: a handler's response that is still to come.

A handler that has done the part of its work that must happen in request order (Produce: the
appends started) returns ``Deferred(future, finish)``: the connection goes on reading and
handling its next requests, and once ``future`` is done, ``finish(its result)`` is the
handler's result. KafkaApis hands the socket server a :class:`PendingResponse`, which the
connection's response queue encodes and writes, in request order, from ``future``'s own done
callback. Callbacks on the one future, not a task per request nor a future per step: between
a WAL commit and the response going out, each would be one more pass of the event loop,
behind whatever else is ready. For the same reason a handler may make its likely response
ahead (``prepare``), while the connection waits for the WAL write: the event loop is idle
then, and the response is on its way as soon as the write is durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger("automq.apis")

T = TypeVar("T")


class Deferred(Generic[T]):
    """``listeners``: a list the maker of ``future`` calls, right after setting it done (with a
    result, an exception, or cancelled: every time), in the same pass of the event loop; the
    response's writer joins it (a done callback of the future would run a pass later, behind
    the requests read meanwhile). None: it has none.

    ``prepare``: called at most once, before ``future`` is done, when the connection has
    nothing else to do while it waits (Produce: its WAL write in flight); it may make ahead
    what ``finish`` will most likely return, so that less is left between the future's
    completion and the response going out. None: nothing to make ahead."""

    __slots__ = ("finish", "future", "listeners", "prepare")

    def __init__(
        self,
        future: asyncio.Future[T],
        finish: Callable[[T], Any],
        listeners: list[Callable[[], object]] | None = None,
        prepare: Callable[[], object] | None = None,
    ) -> None:
        self.future = future
        self.finish = finish
        self.listeners = listeners
        self.prepare = prepare


class PendingResponse:
    """A response to write once ``future`` is done: ``response()`` then encodes it (or the
    error response), or raises what no response can say (the connection closes)."""

    __slots__ = ("_make", "_prepare", "future", "listeners")

    def __init__(
        self,
        future: asyncio.Future[Any],
        make: Callable[[], Any],
        listeners: list[Callable[[], object]] | None = None,
        prepare: Callable[[], object] | None = None,
    ) -> None:
        self.future = future
        self._make = make
        self.listeners = listeners  # see Deferred
        self._prepare = prepare

    @property
    def preparable(self) -> bool:
        """Whether :meth:`prepare` has anything to make ahead."""
        return self._prepare is not None

    def prepare(self) -> None:
        """Make ahead what :meth:`response` will most likely need (see Deferred); once."""
        prepare, self._prepare = self._prepare, None
        if prepare is None:
            return
        try:
            prepare()
        except Exception:  # made again once the future is done, and answered as it fails then
            log.debug("making a response ahead failed", exc_info=True)

    def response(self) -> Any:
        return self._make()

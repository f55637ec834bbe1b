"""Deferred: a handler's response that is still to come.

A handler that has done the part of its work that must happen in request order (Produce: the
appends started) returns ``Deferred(future, finish)``: the connection goes on reading and
handling its next requests, and once ``future`` is done, ``finish(its result)`` is the
handler's result, encoded and written in request order all the same. Callbacks, not a task per
request: between a WAL commit and the response going out, every task wake-up would be one more
pass of the event loop, behind whatever else is ready.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Deferred(Generic[T]):
    __slots__ = ("finish", "future")

    def __init__(self, future: asyncio.Future[T], finish: Callable[[T], Any]) -> None:
        self.future = future
        self.finish = finish

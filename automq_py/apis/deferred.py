"""Deferred: a handler's response that is still to come.

A handler that has done the part of its work that must happen in request order (Produce: the
appends started) returns ``Deferred(awaitable)``; the connection goes on reading and handling
its next requests while the awaitable finishes, and the socket server writes the responses in
request order all the same.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any


class Deferred:
    __slots__ = ("result",)

    def __init__(self, result: Awaitable[Any]) -> None:
        self.result = result

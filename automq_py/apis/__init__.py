"""KafkaApis: one table from ApiKey to (handler, min version, max version).

The table is the one source of the versions served: the socket server decodes a request only
at a version the table lists (``decode_request``'s ``supported``) and ApiVersions advertises
the same table, so what is advertised is what is decoded and handled. A version is listed
only where its handler implements what the version means. Each handler module lists its APIs
as ``HANDLERS``; the hand-written codecs (Produce's decoder, Fetch's encoder) cover exactly
those ranges, the controller's extensions take theirs from ``extensions.MESSAGES``, and kio
(or ``protocol.schemas``, for the Kafka 3.9 versions kio lacks) has a schema for every version
listed. For the Kafka APIs the table is Kafka 3.9's, with the exceptions and their reasons
listed in ``tests/automq_py/apis/test_versions.py``.

A handler returns a kio response entity (encoded here), already-encoded buffers (Fetch's
zero-copy path), or None (no response, as for acks=0 Produce).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable, Generator, Iterable
from datetime import timedelta
from typing import Any

from kio.static.primitive import i32Timedelta

from automq_py.apis import (
    acls,
    cluster,
    configs,
    consumer_groups,
    controller,
    coordinator,
    fetch,
    groups,
    log_dirs,
    metadata,
    produce,
    producer,
    quotas,
    records,
    replication,
    sasl,
    topics,
    transactions,
)
from automq_py.apis.context import BrokerContext, CloseConnection
from automq_py.apis.deferred import Deferred, PendingResponse
from automq_py.errors import describe, kafka_error
from automq_py.security.quotas import REQUEST as REQUEST_QUOTA
from automq_py.security.session import SESSION, THROTTLE_MS
from protocol import api_versions, build, wire
from protocol.api_keys import ApiKey
from protocol.errors import ErrorCode
from protocol.messages import Request, encode_response, request_schema, response_schema

log = logging.getLogger("automq.apis")

Handler = Callable[[BrokerContext, Request], Awaitable[Any]]
HandlerTable = dict[int, tuple[Handler, int, int]]

# each module of this package lists the APIs it handles as ``HANDLERS``
MODULES = (
    produce,
    fetch,
    metadata,
    topics,
    configs,
    cluster,
    log_dirs,
    replication,
    records,
    producer,
    coordinator,
    groups,
    consumer_groups,
    transactions,
    controller,
    sasl,
    acls,
    quotas,
)


# what producers and consumers send all the time: loaded at startup (``warm_up``)
HOT_APIS = (
    ApiKey.PRODUCE,
    ApiKey.FETCH,
    ApiKey.LIST_OFFSETS,
    ApiKey.METADATA,
    ApiKey.API_VERSIONS,
    ApiKey.CREATE_TOPICS,
)


class KafkaApis:
    def __init__(self, ctx: BrokerContext) -> None:
        self.ctx = ctx
        self.table: HandlerTable = {}
        for module in MODULES:
            self.table.update(module.HANDLERS)
        api_versions_handler = metadata.api_versions_handler(lambda: self.supported)
        self.table[ApiKey.API_VERSIONS] = (api_versions_handler, 0, 4)
        # every request is checked against it: made once (the table's versions never change)
        self.supported: dict[int, tuple[int, int]] = {
            key: (lo, hi) for key, (_, lo, hi) in self.table.items()
        }

    async def handle(self, request: Request) -> list[wire.Buffer] | PendingResponse | None:
        """Run ``request``'s handler: its encoded response, None (no response), or the
        response still to come when the handler deferred the rest of its work
        (:class:`Deferred`)."""
        quotas = self.ctx.quotas if self.ctx is not None else None
        if quotas is None or not quotas.any:
            return await self._run_handler(request)
        # The handler's own time counts against the client's request quota, if it has one, as
        # Kafka counts a request's time on its handler threads: not the time it waits (a
        # fetch's long poll, a rebalance, a write's durability), which Kafka's purgatory does
        # not count either. The throttle is the longer of that and its byte quota's, and the
        # response says so where it can (a Fetch's or a Produce's says its byte quota's).
        handler, _, _ = self.table[request.api_key]
        timed = OwnTime(handler(self.ctx, request))
        try:
            result = await timed
        except Exception as e:
            result = e
        throttle = quotas.record(
            REQUEST_QUOTA, SESSION.get().user, request.header.client_id or "", timed.ms
        )
        if throttle > THROTTLE_MS.get():
            THROTTLE_MS.set(throttle)
        if isinstance(result, Exception):
            return self.error_response(request, result)
        return self._answer(request, result, THROTTLE_MS.get())

    def joins_produce_batch(self, first: Request, request: Request) -> bool:
        """Whether Produce ``request``, read right after Produce ``first`` (and whatever joined
        it), may be handled in one append with it (:meth:`handle_produce_batch`)."""
        return self.ctx is not None and produce.joins_batch(self.ctx, first, request)

    async def handle_produce_batch(
        self, requests: list[Request]
    ) -> list[list[wire.Buffer] | PendingResponse | None]:
        """Handle Produce ``requests`` read together, every pair joining
        (:meth:`joins_produce_batch`), as one append: each one's response, as :meth:`handle`
        would give it."""
        try:
            results = await produce.handle_produce_batch(self.ctx, requests)
        except Exception as e:
            return [self.error_response(request, e) for request in requests]
        return [
            self._finish(request, result) if isinstance(result, Deferred) else result
            for request, result in zip(requests, results, strict=True)
        ]

    async def _run_handler(self, request: Request) -> list[wire.Buffer] | PendingResponse | None:
        handler, _, _ = self.table[request.api_key]
        try:
            result = await handler(self.ctx, request)
        except Exception as e:
            # Kafka's handleError: the request is answered with the error, the connection stays
            return self.error_response(request, e)
        return self._answer(request, result)

    def _answer(
        self, request: Request, result: Any, throttle_ms: int = 0
    ) -> list[wire.Buffer] | PendingResponse | None:
        """The handler's ``result`` encoded (or to come, if it deferred), saying the client is
        throttled for ``throttle_ms`` where its response has a throttle time and says less."""
        try:
            if isinstance(result, Deferred):
                return self._finish(request, result)
            if throttle_ms > 0 and _throttle_ms(result) < throttle_ms:
                result = dataclasses.replace(
                    result, throttle_time=i32Timedelta.parse(timedelta(milliseconds=throttle_ms))
                )
            return self._encode(request, result)
        except Exception as e:
            return self.error_response(request, e)

    def _finish(self, request: Request, deferred: Deferred[Any]) -> PendingResponse:
        def make() -> list[wire.Buffer] | None:
            f = deferred.future
            if f.cancelled():
                raise asyncio.CancelledError  # no response can say it: the connection closes
            try:
                return self._encode(request, deferred.finish(f.result()))
            except Exception as e:
                return self.error_response(request, e)

        return PendingResponse(deferred.future, make, deferred.listeners, deferred.prepare)

    @staticmethod
    def _encode(request: Request, result: Any) -> list[wire.Buffer] | None:
        if result is None or isinstance(result, list):
            return result
        return encode_response(request.response_info, result)

    async def warm_up(self, keys: Iterable[int] = HOT_APIS) -> int:
        """Load the request and response schemas (and response build plans) of every
        advertised version of ``keys`` now, rather than inside the first such request: the
        first build of a kio response imports all its versions' modules, tens of ms on the
        event loop. One version at a time, yielding in between, so requests are served
        meanwhile. Returns how many versions were loaded."""
        versions = [
            (key, version)
            for key in keys
            for version in range(self.table[key][1], self.table[key][2] + 1)
        ]
        for key, version in versions:
            request_schema(key, version)
            build.plan(response_schema(key, version))
            await asyncio.sleep(0)
        # what a response built for another version names: it reads every version's module,
        # so only once each is loaded above (asking first imported them all in one step:
        # 20-90 ms per API with the loop held, right after the listener opened)
        for key, version in versions:
            build.field_names(response_schema(key, version))
            await asyncio.sleep(0)
        return len(versions)

    def error_response(self, request: Request, error: Exception) -> list[wire.Buffer]:
        """The response to ``request`` that reports ``error`` on everything it asked for.
        Raises ``error`` again (closing the connection) where no response can say it: acks=0
        Produce, as in Kafka, and APIs whose responses carry no error code at the top."""
        if isinstance(error, CloseConnection):
            raise error
        code = kafka_error(error)
        log.error(
            "%s v%d (correlation id %d) failed, answered %s",
            request.api_key,
            request.api_version,
            request.correlation_id,
            code.name,
            exc_info=error,
        )
        answer = self._error_answer(request, code, describe(error))
        if answer is None:
            raise error
        return answer

    def refusal(self, request: Request, code: ErrorCode, message: str) -> list[wire.Buffer] | None:
        """``request``'s error response saying ``code`` and ``message`` (Kafka's
        ``getErrorResponse``), for a request the broker refuses without handling it; None
        where no response can say it (the connection then closes without one)."""
        return self._error_answer(request, code, message)

    @staticmethod
    def _error_answer(request: Request, code: ErrorCode, message: str) -> list[wire.Buffer] | None:
        body = request.body
        if request.api_key == ApiKey.PRODUCE and body.acks != 0:
            topics = [
                {
                    "name": t.name,
                    "partition_responses": [
                        {"index": p.index, "error_code": code, "error_message": message}
                        for p in t.partitions
                    ],
                }
                for t in body.topics
            ]
            data: dict[str, Any] = {"responses": topics}
        elif request.api_key == ApiKey.FETCH:
            return fetch.error_response(request, code)
        else:
            schema = response_schema(request.api_key, request.api_version)
            if "error_code" not in {f.name for f in dataclasses.fields(schema)}:
                return None
            data = {"error_code": code}
            if "error_message" in build.field_names(schema):
                data["error_message"] = message
        schema = response_schema(request.api_key, request.api_version)
        return encode_response(request.response_info, build.build(schema, data))

    def unsupported_api_versions(self, correlation_id: int) -> list[wire.Buffer]:
        """KIP-511: a v0 ApiVersions response with UNSUPPORTED_VERSION and our ranges."""
        return api_versions.encode_unsupported_api_versions(correlation_id, self.supported)


def _throttle_ms(result: Any) -> int:
    """The throttle time a kio response says, in ms (a large one where it has none: there is
    nothing to raise)."""
    throttle = getattr(result, "throttle_time", None)
    if not isinstance(throttle, timedelta):
        return 1 << 31
    return throttle // timedelta(milliseconds=1)


class OwnTime:
    """Awaits ``awaitable`` as ``await`` would, adding up how long its own steps run, not the
    time it waits between them (what awaits it waits with it). ``ms``: that time so far."""

    __slots__ = ("_seconds", "_steps")

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        self._steps = awaitable.__await__()
        self._seconds = 0.0

    @property
    def ms(self) -> float:
        return self._seconds * 1000

    def __await__(self) -> Generator[Any, Any, Any]:
        steps, clock = self._steps, time.perf_counter
        sent: Any = None
        error: BaseException | None = None
        while True:
            started = clock()
            try:
                step = steps.send(sent) if error is None else steps.throw(error)
            except StopIteration as done:
                return done.value
            finally:
                self._seconds += clock() - started
            sent, error = None, None
            try:
                sent = yield step
            except GeneratorExit:
                steps.close()
                raise
            except BaseException as e:  # (a cancellation): the coroutine handles it
                error = e

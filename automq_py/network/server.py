"""SocketServer: accepts Kafka client connections and runs their requests.

Per connection, requests are handled in arrival order and responses are written in that order
(clients pipeline and match responses by correlation id in order). A handler may return its
response deferred (Produce, once its appends are started): the connection then reads and
handles the next Produce requests while the earlier ones wait for durability, up to
``MAX_QUEUED_RESPONSES`` responses outstanding, after which it stops reading until the oldest
is written. Oversized or malformed frames close the
connection; so does an unsupported API version, except for ApiVersions, which is answered
with the KIP-511 fallback. Idle connections close after ``connections.max.idle.ms``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time

from automq_py.apis import KafkaApis
from automq_py.apis.context import CLIENT_HOST
from automq_py.apis.deferred import PendingResponse
from automq_py.network.frames import FrameConnection
from automq_py.network.request_metrics import RequestMetrics
from protocol import wire
from protocol.api_keys import ApiKey
from protocol.errors import InvalidRequestError, ProtocolError, UnsupportedVersionError
from protocol.messages import decode_request

log = logging.getLogger("automq.network")

# responses a connection may have outstanding (deferred or queued behind one) before it stops
# reading requests; librdkafka's default max.in.flight is far larger, Kafka's clients use 5
MAX_QUEUED_RESPONSES = 64

# requests handled while earlier ones on the connection still wait for their responses:
# consecutive Produce requests; any other request waits until the responses before it are
# written, so it observes their effects (a ListOffsets after a Produce sees its records)
PIPELINED = frozenset({ApiKey.PRODUCE})

Response = list[wire.Buffer] | None | PendingResponse


class SocketServer:
    def __init__(
        self,
        apis: KafkaApis,
        *,
        max_request_size: int,
        idle_timeout_s: float,
    ) -> None:
        self.apis = apis
        self.max_request_size = max_request_size
        self.idle_timeout_s = idle_timeout_s
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.metrics = RequestMetrics()

    async def start(self, host: str, port: int) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: FrameConnection(self._serve, self.max_request_size), host, port
        )
        log.info("listening on %s:%d", host, port)

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._server is not None:
            await self._server.wait_closed()

    async def _serve(self, conn: FrameConnection) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        peer = conn.get_extra_info("peername")
        if isinstance(peer, tuple) and peer:
            CLIENT_HOST.set(f"/{peer[0]}")
        try:
            await self._run(conn)
        except ConnectionError:
            pass
        except ProtocolError as e:
            log.info("closing connection from %s: %s", peer, e)
        except TimeoutError:
            log.debug("closing idle connection from %s", peer)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection from %s after an unexpected error", peer)
        finally:
            self._connections.discard(task)
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    async def _run(self, conn: FrameConnection) -> None:
        responses = _ResponseQueue(conn, MAX_QUEUED_RESPONSES, self.metrics)
        try:
            while True:
                frame = await conn.next_frame(self.idle_timeout_s)
                if frame is None:
                    # the client may have shut down only its sending side: answer what it asked
                    await responses.flush()
                    return
                try:
                    request = decode_request(frame, self.apis.supported)
                except UnsupportedVersionError as e:
                    if e.api_key != ApiKey.API_VERSIONS:
                        raise
                    await responses.put(
                        self.apis.unsupported_api_versions(e.correlation_id),
                        ApiKey.API_VERSIONS,
                        conn.arrived_at,
                    )
                    continue
                except InvalidRequestError:
                    raise
                if request.api_key not in PIPELINED:
                    # every other request sees what the ones before it did, as in Kafka
                    await responses.flush()
                await responses.put(
                    await self.apis.handle(request), request.api_key, conn.arrived_at
                )
        finally:
            responses.abandon()


class _ResponseQueue:
    """A connection's responses in request order: written at once when nothing is ahead of
    them, else queued behind the deferred ones and written, from their completion callbacks,
    as soon as everything ahead of them is. A response that fails (a deferred handler raising
    where no response can say so) closes the connection, as an immediate one would."""

    def __init__(self, writer: FrameConnection, limit: int, metrics: RequestMetrics) -> None:
        self._writer = writer
        self._limit = limit
        self._metrics = metrics
        # each response with its request's API key and arrival time
        self._queue: collections.deque[tuple[Response, int, float]] = collections.deque()
        self._room = asyncio.Event()
        self._drained = asyncio.Event()  # set while nothing is queued
        self._drained.set()
        self._error: BaseException | None = None

    async def put(self, response: Response, api_key: int, arrived_at: float) -> None:
        self._check()
        if not self._queue and not isinstance(response, PendingResponse):
            if response is not None:
                self._write(response, [(api_key, arrived_at)])
                await self._writer.drain()
            return
        self._queue.append((response, api_key, arrived_at))
        self._drained.clear()
        if isinstance(response, PendingResponse):
            response.future.add_done_callback(self._write_ready)
        while len(self._queue) >= self._limit:
            self._room.clear()
            await self._room.wait()
            self._check()
        await self._writer.drain()  # responses written from callbacks waited for nobody

    async def flush(self) -> None:
        """Wait until every queued response is written."""
        await self._drained.wait()
        self._check()

    def abandon(self) -> None:
        """The connection is closing: stop writing; deferred work no longer needs an answer."""
        if self._error is None:
            self._error = ConnectionResetError("connection closed")
        self._queue.clear()
        self._drained.set()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _write(self, buffers: list[wire.Buffer], requests: list[tuple[int, float]]) -> None:
        """Write the responses in ``buffers`` at once; ``requests``: each one's API key and
        arrival time, for the metrics."""
        self._writer.writelines(buffers)
        now = time.perf_counter()
        for api_key, arrived_at in requests:
            self._metrics.record(api_key, now - arrived_at)

    def _write_ready(self, _: object = None) -> None:
        """Write every response at the head of the queue that is ready, in order."""
        if self._error is not None:
            return
        # the responses one WAL commit made ready go out in one write (one syscall, and one
        # wake-up of the client, not one per response)
        ready: list[wire.Buffer] = []
        requests: list[tuple[int, float]] = []
        try:
            while self._queue:
                head, api_key, arrived_at = self._queue[0]
                if isinstance(head, PendingResponse):
                    if not head.future.done():
                        break
                    response = head.response()
                else:
                    response = head
                self._queue.popleft()
                if response is not None:
                    ready += response
                    requests.append((api_key, arrived_at))
        except BaseException as e:
            self._error = e
        if ready:  # (those ahead of a failed one too)
            self._write(ready, requests)
        if self._error is not None:
            self._writer.close()  # the read loop sees the connection end
        if len(self._queue) < self._limit:
            self._room.set()
        if not self._queue or self._error is not None:
            self._drained.set()

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

from automq_py.apis import KafkaApis
from automq_py.apis.context import CLIENT_HOST
from automq_py.network.frames import FrameConnection
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

Response = list[wire.Buffer] | None | asyncio.Future[list[wire.Buffer] | None]


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
        responses = _ResponseQueue(conn, MAX_QUEUED_RESPONSES)
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
                    await responses.put(self.apis.unsupported_api_versions(e.correlation_id))
                    continue
                except InvalidRequestError:
                    raise
                if request.api_key not in PIPELINED:
                    # every other request sees what the ones before it did, as in Kafka
                    await responses.flush()
                await responses.put(await self.apis.handle(request))
        finally:
            responses.abandon()


class _ResponseQueue:
    """A connection's responses in request order: written at once when nothing is ahead of
    them, else queued behind the deferred ones and written by a flush task as they complete.
    A response that fails (a deferred handler raising where no response can say so) closes the
    connection, as an immediate one would."""

    def __init__(self, writer: FrameConnection, limit: int) -> None:
        self._writer = writer
        self._limit = limit
        self._queue: collections.deque[Response] = collections.deque()
        self._room = asyncio.Event()
        self._flusher: asyncio.Task[None] | None = None
        self._error: BaseException | None = None

    async def put(self, response: Response) -> None:
        self._check()
        if not self._queue and not isinstance(response, asyncio.Future):
            if response is not None:
                self._writer.writelines(response)
                await self._writer.drain()
            return
        self._queue.append(response)
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush())
        while len(self._queue) >= self._limit:
            self._room.clear()
            await self._room.wait()
            self._check()

    async def flush(self) -> None:
        """Wait until every queued response is written."""
        if self._flusher is not None:
            await asyncio.wait({self._flusher})
        self._check()

    def abandon(self) -> None:
        """The connection is closing: stop writing; deferred work no longer needs an answer."""
        if self._flusher is not None:
            self._flusher.cancel()
        for response in self._queue:
            if isinstance(response, asyncio.Future):
                response.cancel()
        self._queue.clear()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    async def _flush(self) -> None:
        try:
            while self._queue:
                head = self._queue[0]
                if isinstance(head, asyncio.Future):
                    if not head.done():
                        await asyncio.wait({head})
                    response = head.result()
                else:
                    response = head
                self._queue.popleft()
                self._room.set()
                if response is not None:
                    self._writer.writelines(response)
                    await self._writer.drain()
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            self._error = e
            self._room.set()
            self._writer.close()  # the read loop sees the connection end

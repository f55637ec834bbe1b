"""SocketServer: accepts Kafka client connections and runs their requests.

Per connection, requests are handled in arrival order and responses are written in that order
(clients pipeline and match responses by correlation id in order). A handler may return its
response deferred (Produce, once its appends are started): the connection then reads and
handles the next Produce requests while the earlier ones wait for durability, up to
``MAX_QUEUED_RESPONSES`` responses outstanding, after which it stops reading until the oldest
is written. Produce requests read together (librdkafka sends one per partition, a burst of
them at once) are handled as one append where they may join (the same acks and timeout, none
transactional, no quota in force): one acknowledgement for them all, each still answered on
its own. Deferred responses are made ahead while the connection waits for the WAL write,
so that they go out as soon as it is durable. Oversized or malformed frames close the
connection; so does an unsupported API version, except for ApiVersions, which is answered
with the KIP-511 fallback. Idle connections close after ``connections.max.idle.ms``.

It serves one or more listeners (:class:`Endpoint`): each a port with its security protocol.
On SSL ones TLS is done by the event loop's transport; on SASL ones a connection authenticates
first (:mod:`automq_py.network.authenticator`), reading no request larger than
``sasl.server.max.receive.size`` until then. Each connection's task carries its
:class:`~automq_py.apis.context.Session`: the principal the authorizer checks.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ipaddress
import logging
import socket
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from automq_py.apis import KafkaApis
from automq_py.apis.context import CLIENT_HOST, CloseConnection
from automq_py.apis.deferred import PendingResponse
from automq_py.network.authenticator import MechanismFactory, SaslAuthenticator
from automq_py.network.frames import FrameConnection
from automq_py.network.request_metrics import RequestMetrics
from automq_py.security.errors import IllegalSaslStateError
from automq_py.security.session import ANONYMOUS, SESSION, THROTTLE_MS, Session
from protocol import wire
from protocol.api_keys import ApiKey
from protocol.errors import FrameTooLargeError, ProtocolError, UnsupportedVersionError
from protocol.framing import SIZE
from protocol.messages import Request, decode_request, encode_response

log = logging.getLogger("automq.network")

# responses a connection may have outstanding (deferred or queued behind one) before it stops
# reading requests; librdkafka's default max.in.flight is far larger, Kafka's clients use 5
MAX_QUEUED_RESPONSES = 64

# requests handled while earlier ones on the connection still wait for their responses:
# consecutive Produce requests; any other request waits until the responses before it are
# written, so it observes their effects (a ListOffsets after a Produce sees its records)
PIPELINED = frozenset({ApiKey.PRODUCE})

Response = list[wire.Buffer] | None | PendingResponse
# a client that connects to an SSL port has this long to finish its TLS handshake
SSL_HANDSHAKE_TIMEOUT_S = 10.0


@dataclass(slots=True, frozen=True)
class Endpoint:
    """One listener to serve: where it binds and what it asks of clients."""

    name: str
    host: str
    port: int
    ssl: ssl.SSLContext | None = None
    # for SASL listeners: the mechanisms enabled and a new server-side exchange of one
    sasl_mechanisms: tuple[str, ...] = ()
    new_mechanism: MechanismFactory | None = None
    # the principal of a TLS client from its certificate's subject (None: ANONYMOUS)
    ssl_principal: Callable[[dict[str, object]], str] | None = None
    # mechanism -> connections.max.reauth.ms, where the listener sets its own
    max_reauth_ms: Mapping[str, int] = field(default_factory=dict)


@dataclass(slots=True, frozen=True)
class AuthenticationSettings:
    """How SASL listeners treat their clients (Kafka's properties of the same names)."""

    max_reauth_ms: int = 0  # connections.max.reauth.ms
    failed_delay_ms: int = 100  # connection.failed.authentication.delay.ms
    max_receive_size: int = 524_288  # sasl.server.max.receive.size


class SocketServer:
    def __init__(
        self,
        apis: KafkaApis,
        *,
        max_request_size: int,
        idle_timeout_s: float,
        send_buffer_bytes: int = -1,
        receive_buffer_bytes: int = -1,
        authentication: AuthenticationSettings | None = None,
        request_phases: bool = True,
    ) -> None:
        self.apis = apis
        self.max_request_size = max_request_size
        # SO_SNDBUF of each connection, SO_RCVBUF of each listening socket (its connections
        # inherit it, and the window scale their handshake agrees on follows it); -1: the OS's
        self.send_buffer_bytes = send_buffer_bytes
        self.receive_buffer_bytes = receive_buffer_bytes
        self.idle_timeout_s = idle_timeout_s
        self.authentication = authentication or AuthenticationSettings()
        self._servers: list[tuple[Endpoint, asyncio.Server]] = []
        self._connections: set[asyncio.Task[None]] = set()
        self.metrics = RequestMetrics(phases=request_phases)
        # called when a connection has handled every request it has read, before it waits for
        # more: the broker commits the WAL appends they queued (WriteAheadLog.commit_now)
        self.on_idle: Callable[[], object] | None = None
        # called between two requests a connection read together: the broker acknowledges the
        # WAL commits that completed meanwhile (WriteAheadLog.acknowledge_completed), whose
        # responses would otherwise wait until the connection had handled the rest
        self.between_requests: Callable[[], object] | None = None
        # per listener: connections open now, and ever accepted (SocketServer's
        # connection-count and connection-creation-total)
        self.connection_count: dict[str, int] = {}
        self.connections_created: dict[str, int] = {}

    async def start(self, host: str, port: int) -> None:
        """Serve one PLAINTEXT listener."""
        await self.start_listeners([Endpoint("PLAINTEXT", host, port)])

    async def start_listeners(self, endpoints: list[Endpoint]) -> None:
        loop = asyncio.get_running_loop()
        for endpoint in endpoints:
            server = await loop.create_server(
                lambda e=endpoint: FrameConnection(
                    lambda conn: self._serve(conn, e),
                    self._first_frame_limit(e),
                    send_buffer_bytes=self.send_buffer_bytes,
                ),
                endpoint.host,
                endpoint.port,
                ssl=endpoint.ssl,
                ssl_handshake_timeout=SSL_HANDSHAKE_TIMEOUT_S if endpoint.ssl else None,
                start_serving=False,
            )
            if self.receive_buffer_bytes > 0:
                for sock in server.sockets:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer_bytes)
            self._servers.append((endpoint, server))
        # every port is bound before any accepts, and the first listener (where clients
        # bootstrap and supervisors look for readiness) accepts last: once it answers, all do
        for endpoint, server in reversed(self._servers):
            await server.start_serving()
            log.info("listening on %s:%d (%s)", endpoint.host, endpoint.port, endpoint.name)

    def _first_frame_limit(self, endpoint: Endpoint) -> int:
        if endpoint.new_mechanism is None:
            return self.max_request_size
        return min(self.max_request_size, self.authentication.max_receive_size)

    @property
    def port(self) -> int:
        """The first listener's port."""
        return self.listener_port(self._servers[0][0].name)

    @property
    def listener_names(self) -> list[str]:
        return [endpoint.name for endpoint, _ in self._servers]

    def listener_port(self, name: str) -> int:
        """The port listener ``name`` is bound to (its own, when it was asked for port 0)."""
        for endpoint, server in self._servers:
            if endpoint.name == name:
                return int(server.sockets[0].getsockname()[1])
        raise KeyError(name)

    async def stop(self) -> None:
        for _, server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        for task in list(self._connections):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for _, server in self._servers:
            await server.wait_closed()

    async def _serve(self, conn: FrameConnection, endpoint: Endpoint) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        listener = endpoint.name
        self.connection_count[listener] = self.connection_count.get(listener, 0) + 1
        self.connections_created[listener] = self.connections_created.get(listener, 0) + 1
        peer = conn.get_extra_info("peername")
        address = java_host_address(str(peer[0])) if isinstance(peer, tuple) and peer else ""
        if address:
            CLIENT_HOST.set(f"/{address}")
        try:
            principal = ANONYMOUS
            if endpoint.ssl_principal is not None:
                cert = conn.get_extra_info("peercert")
                if cert:
                    principal = endpoint.ssl_principal(cert)
            SESSION.set(Session(principal, address, endpoint.name))
            if endpoint.new_mechanism is None:
                await self._run(conn)
            else:
                await self._run_authenticated(conn, endpoint)
        except ConnectionError:
            pass
        except (ProtocolError, IllegalSaslStateError, ValueError, CloseConnection) as e:
            log.info("closing connection from %s: %s", peer, e)
        except TimeoutError:
            log.debug("closing idle connection from %s", peer)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("closing connection from %s after an unexpected error", peer)
        finally:
            self._connections.discard(task)
            self.connection_count[listener] -= 1
            conn.close()
            with contextlib.suppress(Exception):
                await conn.wait_closed()

    async def _run(self, conn: FrameConnection) -> None:
        responses = _ResponseQueue(conn, MAX_QUEUED_RESPONSES, self.metrics)
        # a request read while gathering a batch that could not join it: handled next
        held: tuple[Request, float] | None = None
        try:
            while True:
                if held is not None:
                    (request, arrived), held = held, None
                else:
                    frame = await self._next_frame(conn, responses)
                    if frame is None:
                        return
                    decoded = await self._decode(frame, conn, responses)
                    if decoded is None:
                        continue
                    request, arrived = decoded, conn.arrived_at
                if request.api_key not in PIPELINED:
                    # every other request sees what the ones before it did, as in Kafka
                    await responses.flush()
                elif conn.frames_waiting and self.apis.joins_produce_batch(request, request):
                    held = await self._produce_batch(conn, request, arrived, responses)
                    continue
                await self._handle(request, arrived, responses)
        finally:
            responses.abandon()

    async def _produce_batch(
        self,
        conn: FrameConnection,
        first: Request,
        arrived: float,
        responses: _ResponseQueue,
        admits: Callable[[Request], bool] | None = None,
    ) -> tuple[Request, float] | None:
        """Handle Produce request ``first`` with the Produce requests read with it that may join
        it (librdkafka's burst: a request per partition; on a SASL listener only those
        ``admits`` lets through) as one append; return the first request read that could not
        join, to be handled next (None: every one joined)."""
        batch = [(first, arrived)]
        held: tuple[Request, float] | None = None
        try:
            while conn.frames_waiting:
                frame = await conn.next_frame(None)  # (waiting: at once)
                if frame is None:
                    break
                request = await self._decode(frame, conn, responses)
                if request is None:
                    continue
                if (
                    request.api_key == ApiKey.PRODUCE
                    and (admits is None or admits(request))
                    and self.apis.joins_produce_batch(first, request)
                ):
                    batch.append((request, conn.arrived_at))
                    continue
                held = (request, conn.arrived_at)
                break
        except asyncio.CancelledError:
            raise
        except BaseException:
            # a frame that cannot be read closes the connection: after the ones before it
            await self._handle_batch(conn, batch, responses)
            raise
        await self._handle_batch(conn, batch, responses)
        return held

    async def _next_frame(
        self, conn: FrameConnection, responses: _ResponseQueue
    ) -> memoryview | None:
        """The connection's next frame; None once the client has closed its side, after what
        it asked is answered (it may have shut down only its sending side)."""
        self._before_next(conn)
        if not conn.frames_waiting:
            # the connection will wait: while the WAL writes its requests, its responses still
            # to come are made ahead, so that they go out as soon as the write is durable
            responses.prepare()
        frame = await conn.next_frame(self.idle_timeout_s)
        if frame is None:
            await responses.flush()
        return frame

    def _before_next(self, conn: FrameConnection) -> None:
        """Before a connection takes its next request: with none waiting, the WAL commits
        what its requests queued (``on_idle``); with more waiting, it acknowledges what has
        become durable meanwhile (``between_requests``)."""
        if not conn.frames_waiting:
            if self.on_idle is not None:
                self.on_idle()
        elif self.between_requests is not None:
            self.between_requests()

    async def _decode(
        self, frame: memoryview, conn: FrameConnection, responses: _ResponseQueue
    ) -> Request | None:
        """The request in ``frame``; None when it was answered here (an ApiVersions at a
        version this broker does not know: KIP-511's fallback)."""
        try:
            return decode_request(frame, self.apis.supported)
        except UnsupportedVersionError as e:
            if e.api_key != ApiKey.API_VERSIONS:
                raise
            now = time.perf_counter()
            await responses.put(
                self.apis.unsupported_api_versions(e.correlation_id),
                (ApiKey.API_VERSIONS, e.api_version, conn.arrived_at, now, now),
            )
            return None

    async def _run_authenticated(self, conn: FrameConnection, endpoint: Endpoint) -> None:
        """Serve a SASL listener's connection: the exchange first, then requests as
        :meth:`_run` does, while the session lasts."""
        assert endpoint.new_mechanism is not None
        settings = self.authentication
        auth = SaslAuthenticator(
            endpoint.sasl_mechanisms,
            endpoint.new_mechanism,
            max_reauth_ms=settings.max_reauth_ms,
            failed_delay_ms=settings.failed_delay_ms,
            max_reauth_ms_by_mechanism=endpoint.max_reauth_ms,
        )
        session = SESSION.get()
        responses = _ResponseQueue(conn, MAX_QUEUED_RESPONSES, self.metrics)
        held: tuple[Request, float] | None = None  # as in _run

        def admits(request: Request) -> bool:
            """Whether a request read with a batch's first may join it: neither part of a
            (re-)authentication nor past the session's end (those are handled on their own,
            below)."""
            return not auth.intercepts(request) and not auth.expired()

        try:
            while True:
                if held is not None:
                    (request, arrived), held = held, None
                else:
                    try:
                        frame = await self._next_frame(conn, responses)
                    except FrameTooLargeError:
                        if not auth.authenticated:
                            # over sasl.server.max.receive.size: a failed authentication,
                            # closed after its delay (Kafka's "invalid receive size")
                            await asyncio.sleep(settings.failed_delay_ms / 1000)
                        raise
                    if frame is None:
                        return
                    if auth.raw_tokens:
                        outcome = await auth.raw_token(bytes(frame))
                        if outcome.delay_s:
                            await asyncio.sleep(outcome.delay_s)
                        if outcome.close:
                            return  # (a v0 client learns of a refusal by the connection closing)
                        conn.writelines([SIZE.pack(len(outcome.response)), outcome.response])
                        await conn.drain()
                        if auth.authenticated:
                            self._authenticated(conn, auth, session)
                        continue
                    decoded = await self._decode(frame, conn, responses)
                    if decoded is None:
                        continue
                    request, arrived = decoded, conn.arrived_at
                if auth.intercepts(request):
                    await responses.flush()
                    was_authenticated = auth.authenticated
                    outcome = await auth.handle(request)
                    if outcome.delay_s:
                        await asyncio.sleep(outcome.delay_s)
                    now = time.perf_counter()
                    times = (request.api_key, request.api_version, arrived, now, now)
                    if outcome.refusal is not None:
                        code, message = outcome.refusal
                        await responses.put(self.apis.refusal(request, code, message), times)
                    elif outcome.response is not None:
                        encoded = encode_response(request.response_info, outcome.response)
                        await responses.put(encoded, times)
                    if outcome.close:
                        await responses.flush()
                        return
                    if auth.authenticated and not was_authenticated:
                        self._authenticated(conn, auth, session)
                    continue
                if auth.expired():
                    log.info(
                        "closing connection from %s: its session expired (%s)",
                        session.address,
                        auth.principal,
                    )
                    return
                if request.api_key not in PIPELINED:
                    await responses.flush()
                elif conn.frames_waiting and self.apis.joins_produce_batch(request, request):
                    held = await self._produce_batch(conn, request, arrived, responses, admits)
                    continue
                await self._handle(request, arrived, responses)
        finally:
            responses.abandon()

    async def _handle(self, request: Request, arrived: float, responses: _ResponseQueue) -> None:
        """Handle ``request`` and queue its response; then, over a quota, mute the channel."""
        started = time.perf_counter()
        response = await self.apis.handle(request)
        times = (request.api_key, request.api_version, arrived, started, time.perf_counter())
        await responses.put(response, times)
        if THROTTLE_MS.get():
            await _muted()

    async def _handle_batch(
        self, conn: FrameConnection, batch: list[tuple[Request, float]], responses: _ResponseQueue
    ) -> None:
        """Handle the Produce requests of ``batch`` (each with its arrival) as one append, and
        queue each one's response."""
        if len(batch) == 1:
            await self._handle(*batch[0], responses)
            return
        started = time.perf_counter()
        answers = await self.apis.handle_produce_batch([request for request, _ in batch])
        handled = time.perf_counter()
        if not conn.frames_waiting and self.on_idle is not None:
            # nothing more read: the WAL commits the batch's appends now, its responses queued
            # while the write is in flight rather than before it starts
            self.on_idle()
        for (request, arrived), response in zip(batch, answers, strict=True):
            times = (request.api_key, request.api_version, arrived, started, handled)
            await responses.put(response, times)

    def _authenticated(self, conn: FrameConnection, auth: SaslAuthenticator, old: Session) -> None:
        """The connection authenticated: its requests act as the principal, at any size."""
        assert auth.principal is not None
        SESSION.set(Session(auth.principal, old.address, old.listener))
        conn.max_frame_size = self.max_request_size


# a request's API key, version, and when it arrived, its handler started and returned
RequestTimes = tuple[int, int, float, float, float]


async def _muted() -> None:
    """The client went over a quota: read nothing more from it until its throttle time is
    over (Kafka mutes the channel; the response already says how long, KIP-219)."""
    throttle_ms = THROTTLE_MS.get()
    THROTTLE_MS.set(0)
    await asyncio.sleep(throttle_ms / 1000)


_ready_queues: set[_ResponseQueue] = set()  # with a response made ready, not yet written
_flush_scheduled: asyncio.AbstractEventLoop | None = None  # the loop a write is due on


def write_ready_responses() -> None:
    """Write the responses WAL acknowledgements made ready, a write per connection: the
    broker calls it after each group of acknowledgements (``after_acknowledgements``)."""
    global _flush_scheduled
    _flush_scheduled = None
    while _ready_queues:
        _ready_queues.pop()._write_ready()


class _ResponseQueue:
    """A connection's responses in request order: written at once when nothing is ahead of
    them, else queued behind the deferred ones and written, from their completion callbacks,
    as soon as everything ahead of them is. A response that fails (a deferred handler raising
    where no response can say so) closes the connection, as an immediate one would."""

    def __init__(self, writer: FrameConnection, limit: int, metrics: RequestMetrics) -> None:
        self._writer = writer
        self._limit = limit
        self._metrics = metrics
        # each response with its request's times
        self._queue: collections.deque[tuple[Response, RequestTimes]] = collections.deque()
        self._room = asyncio.Event()
        self._drained = asyncio.Event()  # set while nothing is queued
        self._drained.set()
        self._error: BaseException | None = None
        self._unprepared: list[PendingResponse] = []  # queued since the last prepare()

    async def put(self, response: Response, times: RequestTimes) -> None:
        """Queue ``response``; ``times``: its request's API key, version, and when it arrived,
        its handler started and returned (``perf_counter``), for the metrics."""
        self._check()
        if not self._queue and not isinstance(response, PendingResponse):
            if response is not None:
                self._write(response, [times])
                await self._writer.drain()
            return
        self._queue.append((response, times))
        self._drained.clear()
        if isinstance(response, PendingResponse):
            # written as soon as it is ready, from its maker's listeners (called whenever it
            # sets the future done); without them, from the future's done callback
            listeners = response.listeners
            if listeners is not None and not response.future.done():
                # (the responses of one batch share its listeners: this queue joins them once)
                if not listeners or listeners[-1] != self._write_soon:
                    listeners.append(self._write_soon)
            else:
                response.future.add_done_callback(self._write_ready)
            if response.preparable:
                self._unprepared.append(response)
        while len(self._queue) >= self._limit:
            self._room.clear()
            await self._room.wait()
            self._check()
        await self._writer.drain()  # responses written from callbacks waited for nobody

    def prepare(self) -> None:
        """Make ahead the responses queued since the last call whose futures are not done yet
        (:meth:`PendingResponse.prepare`): the connection is about to wait, so the event loop
        does it while what they wait for is under way rather than after."""
        unprepared, self._unprepared = self._unprepared, []
        for response in unprepared:
            if not response.future.done():
                response.prepare()

    async def flush(self) -> None:
        """Wait until every queued response is written."""
        await self._drained.wait()
        self._check()

    def abandon(self) -> None:
        """The connection is closing: stop writing; deferred work no longer needs an answer."""
        if self._error is None:
            self._error = ConnectionResetError("connection closed")
        self._queue.clear()
        self._unprepared.clear()
        self._drained.set()

    def _check(self) -> None:
        if self._error is not None:
            raise self._error

    def _write(self, buffers: list[wire.Buffer], requests: list[RequestTimes]) -> None:
        """Write the responses in ``buffers`` at once; ``requests``: each one's times."""
        written = time.perf_counter()
        self._writer.writelines(buffers)
        sent = time.perf_counter()
        record = self._metrics.record_request
        for api_key, version, arrived, started, handled in requests:
            record(api_key, version, arrived, started, handled, written, sent)

    def _write_soon(self) -> None:
        """A response became ready inside a WAL commit's completion: write it with every
        other response that commit made ready, as the commit's acknowledgements end
        (:func:`write_ready_responses`), or else at the start of the event loop's next pass,
        before the requests read meanwhile are handled. (A done callback of its future would
        run a pass later, after them; writing at once, one write per response.)"""
        global _flush_scheduled
        _ready_queues.add(self)
        loop = asyncio.get_running_loop()
        if _flush_scheduled is not loop:  # (not on a loop that closed before it ran)
            _flush_scheduled = loop
            loop.call_soon(write_ready_responses)

    def _write_ready(self, _: object = None) -> None:
        """Write every response at the head of the queue that is ready, in order."""
        if self._error is not None:
            return
        # the responses one WAL commit made ready go out in one write (one syscall, and one
        # wake-up of the client, not one per response)
        ready: list[wire.Buffer] = []
        requests: list[RequestTimes] = []
        try:
            while self._queue:
                head, times = self._queue[0]
                if isinstance(head, PendingResponse):
                    if not head.future.done():
                        break
                    response = head.response()
                else:
                    response = head
                self._queue.popleft()
                if response is not None:
                    ready += response
                    requests.append(times)
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


def java_host_address(address: str) -> str:
    """A client's address as Java's ``InetAddress.getHostAddress()`` writes it, which Kafka
    matches ACL hosts against and shows as a member's client host: an IPv6 address in full
    (``0:0:0:0:0:0:0:1``, not ``::1``), an IPv4-mapped one as its IPv4 address."""
    host, percent, scope = address.partition("%")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return address
    if isinstance(ip, ipaddress.IPv4Address):
        return str(ip)
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    full = ":".join(f"{int(group, 16):x}" for group in ip.exploded.split(":"))
    return full + percent + scope

"""FrameConnection: one client connection's Kafka frames in, responses out, with few copies.

It is a ``BufferedProtocol``: the transport reads the socket straight into memory the
protocol hands out. Small frames arrive in a staging buffer and are copied out whole; a frame
too large for it gets a buffer of its own and the socket is read straight into that, so a
megabyte Produce request is copied by the kernel and never by us. That buffer comes from the C
heap uninitialised (``storage.heap.heap_buffer``): a bytearray's zeroing of every byte the
socket then overwrites took 6% of the broker's CPU under a saturating producer's 700 KB
requests. (``StreamReader`` copied
every byte three times: into its buffer, out of it, and the rest of the buffer down.)

Reading pauses while ``max_queued`` frames wait for the connection's task (backpressure to
the client); writing has ``StreamWriter``'s flow control (``drain`` waits while the
transport's buffer is above its high-water mark).

A size prefix that is negative or above ``max_frame_size`` stops reading; ``next_frame``
raises it (the server closes the connection) without allocating the announced size.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import socket
import struct
import time
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, cast

from protocol import wire
from protocol.api_keys import ApiKey
from protocol.errors import ProtocolError
from protocol.framing import SIZE, SIZE_BYTES, check_frame_size
from storage.heap import heap_buffer

API_KEY = struct.Struct(">h")  # a request's first field
STAGE_SIZE = 64 * 1024  # frames up to this size (prefix included) are read into the stage
MAX_QUEUED = 8  # frames read ahead of the connection's task before reading pauses
# SO_SNDBUF asked for (the kernel keeps twice it, at most twice net.core.wmem_max) once a
# response does not fit in a connection whose send buffer the OS manages: a consumer's fetch
# of 1 MiB from each of 8 partitions then goes into the socket in one write, not two or three
# with a wait for the client to read in between (~10% less of the broker's CPU per GB read)
RESPONSE_SEND_BUFFER = 4 * 1024 * 1024
_QUICKACK: int | None = getattr(socket, "TCP_QUICKACK", None)  # Linux only

Serve = Callable[["FrameConnection"], Coroutine[Any, Any, None]]


class FrameConnection(asyncio.BufferedProtocol):
    def __init__(
        self,
        serve: Serve,
        max_frame_size: int,
        max_queued: int = MAX_QUEUED,
        *,
        send_buffer_bytes: int = -1,
    ) -> None:
        self._serve = serve
        self._send_buffer_bytes = send_buffer_bytes  # SO_SNDBUF (-1: the OS's, which grows it)
        # the OS's send buffer, not yet widened for a response that did not fit
        self._widen_send_buffer = send_buffer_bytes <= 0
        self._loop = asyncio.get_running_loop()
        self.max_frame_size = max_frame_size
        self._max_queued = max_queued
        self._transport: asyncio.Transport | None = None
        self._socket: Any = None  # the transport's socket (None: it has none)
        self._sock: Any = None  # the TCP socket asked for quick ACKs (None: not asked)
        self._tls = False
        self.task: asyncio.Task[None] | None = None
        # reading
        self._stage = bytearray(STAGE_SIZE)
        self._stage_view = memoryview(self._stage)
        self._staged = 0  # bytes of the stage filled
        self._frame: memoryview | None = None  # a large frame being read into its own buffer
        self._filled = 0  # bytes of ``_frame`` filled
        self._frames: collections.deque[tuple[memoryview, float]] = collections.deque()
        self.arrived_at = 0.0  # perf_counter() when the frame last taken was read in full
        self._waiter: asyncio.Future[None] | None = None
        self._ended = False  # the client closed its side, or the connection was lost
        self._error: ProtocolError | None = None
        self._read_paused = False
        # writing
        self._write_paused = False
        self._drain_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._lost = False
        self._closed: asyncio.Future[None] = self._loop.create_future()

    # -- the transport's side --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # (uvloop's transports are not asyncio.Transport subclasses; they have its methods)
        self._transport = cast(asyncio.Transport, transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and self._send_buffer_bytes > 0:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, self._send_buffer_bytes)
        self._socket = sock
        self._sock = sock if _QUICKACK is not None and sock is not None else None
        self._quickack()
        # TLS has no half-closed connections: its transport closes at the client's EOF
        self._tls = transport.get_extra_info("sslcontext") is not None
        self.task = self._loop.create_task(self._serve(self))

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._frame is not None:
            return self._frame[self._filled :]
        return self._stage_view[self._staged :]

    def buffer_updated(self, nbytes: int) -> None:
        self._quickack()
        if self._frame is not None:
            self._filled += nbytes
            if self._filled == len(self._frame):
                # writable: the frame is this request's own memory (a Produce request's batches
                # get their offsets in place)
                self._push(self._frame)
                self._frame = None
            return
        self._staged += nbytes
        try:
            self._split_stage()
        except ProtocolError as e:
            self._error = e
            self._pause_reading()
            self._wake()

    def _quickack(self) -> None:
        """Acknowledge what was read at once, not with the response (Linux's quick-ack mode
        ends by itself, so it is asked for again after every read). A client with Nagle's
        algorithm on (librdkafka's default, ``socket.nagle.disable=false``) holds each request
        smaller than a segment until the one before it is acknowledged: with the ACK delayed
        to ride on a response that waits for the WAL, each of a burst of requests (librdkafka
        sends one per partition) waited for the previous one's fsync before it was sent."""
        if self._sock is not None:
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, _QUICKACK, 1)
            except OSError:  # not TCP after all (a unix socket): stop asking
                self._sock = None

    def eof_received(self) -> bool:
        self._ended = True
        self._wake()
        # keep the transport open: the responses already due are still written
        return not self._tls

    def connection_lost(self, exc: Exception | None) -> None:
        self._ended = True
        self._lost = True
        self._wake()
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                waiter.set_exception(ConnectionResetError("connection lost"))
        if not self._closed.done():
            self._closed.set_result(None)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        while self._drain_waiters:
            waiter = self._drain_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    def _split_stage(self) -> None:
        """Take the complete frames out of the stage; move a large frame's start into a buffer
        of its own; keep the rest at the stage's start."""
        stage, view = self._stage, self._stage_view
        pos, end = 0, self._staged
        while end - pos >= SIZE_BYTES:
            (size,) = SIZE.unpack_from(stage, pos)
            check_frame_size(size, self.max_frame_size)
            start = pos + SIZE_BYTES
            if end - start >= size:
                frame_view = view[start : start + size]
                # a Produce request in memory of its own, writable: the broker sets its
                # batches' offsets in place (protocol.messages.decode_request), no second
                # copy; every other request as bytes, which kio's decoders take
                produce = size >= 2 and API_KEY.unpack_from(stage, start)[0] == ApiKey.PRODUCE
                self._push(memoryview(bytearray(frame_view) if produce else bytes(frame_view)))
                pos = start + size
                continue
            if SIZE_BYTES + size > STAGE_SIZE:
                frame = heap_buffer(size)
                frame[: end - start] = view[start:end]
                self._frame, self._filled = frame, end - start
                pos = end
            break
        if pos:
            view[: end - pos] = view[pos:end]  # (memmove: overlapping views are safe)
            self._staged = end - pos

    def _push(self, frame: memoryview) -> None:
        self._frames.append((frame, time.perf_counter()))
        if len(self._frames) >= self._max_queued:
            self._pause_reading()
        self._wake()

    def _pause_reading(self) -> None:
        if not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- the connection task's side --------------------------------------------------------------

    def get_extra_info(self, name: str) -> Any:
        return self._transport.get_extra_info(name) if self._transport is not None else None

    @property
    def frames_waiting(self) -> bool:
        """Whether a frame read is waiting for the connection's task."""
        return bool(self._frames)

    async def next_frame(self, timeout: float | None) -> memoryview | None:
        """The next frame's payload (a large one writable: its own buffer), None once the
        client closed its side;
        ``TimeoutError`` when nothing arrives for ``timeout`` seconds; a framing error
        (after the frames before it)."""
        while not self._frames:
            if self._error is not None:
                raise self._error
            if self._ended:
                return None
            # awaited directly, its timeout a timer that fails it: asyncio.wait_for would put
            # one more pass of the event loop between a frame's arrival and its handling
            waiter = self._waiter = self._loop.create_future()
            timer = None if timeout is None else self._loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        frame, self.arrived_at = self._frames.popleft()
        if self._read_paused and self._error is None and len(self._frames) <= self._max_queued // 2:
            self._read_paused = False
            if self._transport is not None and not self._transport.is_closing():
                self._transport.resume_reading()
        return frame

    def writelines(self, buffers: Iterable[wire.Buffer]) -> None:
        transport = self._transport
        if transport is not None and not transport.is_closing():
            transport.writelines(buffers)
            if self._widen_send_buffer and transport.get_write_buffer_size():
                self._widen_send_buffer = False
                widen_send_buffer(self._socket)

    async def drain(self) -> None:
        """Wait while the transport holds more unsent bytes than its high-water mark."""
        if self._lost:
            raise ConnectionResetError("connection lost")
        if not self._write_paused:
            return
        waiter = self._loop.create_future()
        self._drain_waiters.append(waiter)
        await waiter

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    async def wait_closed(self) -> None:
        await asyncio.shield(self._closed)


def widen_send_buffer(sock: socket.socket | None) -> None:
    """Raise ``sock``'s send buffer to :data:`RESPONSE_SEND_BUFFER` (or the most
    ``net.core.wmem_max`` allows) where that is more than it has; the kernel stops growing it
    by itself from then on. Where the limit is unknown (not Linux) it is left alone."""
    limit = _wmem_max()
    if sock is None or limit is None:
        return
    asked = min(RESPONSE_SEND_BUFFER, limit)
    try:
        if 2 * asked > sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, asked)
    except OSError:  # closed meanwhile, or not a socket that has one
        pass


@functools.cache
def _wmem_max() -> int | None:
    """The largest SO_SNDBUF an unprivileged process may ask for (Linux), None if unknown."""
    try:
        with open("/proc/sys/net/core/wmem_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _expire(waiter: asyncio.Future[None]) -> None:
    """``next_frame``'s timeout: nothing arrived in time."""
    if not waiter.done():
        waiter.set_exception(TimeoutError())

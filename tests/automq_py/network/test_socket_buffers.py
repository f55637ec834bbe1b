"""Kafka's socket.send.buffer.bytes and socket.receive.buffer.bytes on real sockets: the send
buffer set on each accepted connection, the receive buffer on each listening socket (whose
connections inherit it), and -1 leaving both to the OS. Linux reports twice the size asked for
(the kernel's own bookkeeping, as its socket(7) says)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket

from automq_py.apis import KafkaApis
from automq_py.network.frames import RESPONSE_SEND_BUFFER, FrameConnection
from automq_py.network.server import SocketServer
from tests.automq_py.network.test_frames import SocketTransport, _ignore


def _sndbuf(sock: socket.socket) -> int:
    return sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)


async def test_an_accepted_connection_takes_the_send_buffer_asked_for() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    clients, accepted = [], []
    try:
        for _ in range(2):
            clients.append(socket.create_connection(server.getsockname()))
            accepted.append(server.accept()[0])
        untouched = _sndbuf(accepted[1])
        conn = FrameConnection(_ignore, 1 << 20, send_buffer_bytes=48 * 1024)
        conn.connection_made(SocketTransport(accepted[0]))  # type: ignore[arg-type]
        assert _sndbuf(accepted[0]) == 2 * 48 * 1024
        default = FrameConnection(_ignore, 1 << 20)  # -1: the OS's
        default.connection_made(SocketTransport(accepted[1]))  # type: ignore[arg-type]
        assert _sndbuf(accepted[1]) == untouched
        for c in (conn, default):
            if c.task is not None:
                await c.task
    finally:
        for s in (*clients, *accepted, server):
            s.close()


async def test_the_servers_listeners_and_connections_take_both_sizes() -> None:
    server = SocketServer(
        KafkaApis(ctx=None),  # type: ignore[arg-type]  # no request is sent
        max_request_size=1 << 20,
        idle_timeout_s=30,
        send_buffer_bytes=40 * 1024,
        receive_buffer_bytes=56 * 1024,
    )
    await server.start("127.0.0.1", 0)
    try:
        listeners = [sock for _, srv in server._servers for sock in srv.sockets]
        assert [s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) for s in listeners] == [
            2 * 56 * 1024
        ]
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            accepted = await _accepted_socket(server.port)
            try:
                assert _sndbuf(accepted) == 2 * 40 * 1024
                assert accepted.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) == 2 * 56 * 1024
            finally:
                accepted.close()  # (a duplicate of the server's descriptor)
        finally:
            writer.close()
    finally:
        await server.stop()


async def _accepted_socket(port: int) -> socket.socket:
    """A duplicate of the server's side of the one connection to ``port`` (this process holds
    both ends): the descriptor whose local port is ``port`` and that has a peer."""
    for _ in range(100):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError, ValueError):
                if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                    continue
                sock = socket.socket(fileno=os.dup(int(fd)))
                try:
                    if sock.family == socket.AF_INET and sock.getsockname()[1] == port:
                        sock.getpeername()  # (a listener has none: OSError)
                        return sock
                except OSError:
                    pass
                sock.close()
        await asyncio.sleep(0.01)  # not accepted yet
    raise AssertionError(f"no accepted connection on port {port}")


async def _serve_once(payload: bytes, send_buffer_bytes: int) -> int:
    """Serve one connection that writes ``payload`` as one response while the client reads
    nothing yet; the server side's SO_SNDBUF once written, and the payload read back whole."""
    written: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def serve(conn: FrameConnection) -> None:
        conn.writelines([payload])
        sock = conn.get_extra_info("socket")
        written.set_result(sock.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF))
        await conn.drain()

    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: FrameConnection(serve, 1 << 20, send_buffer_bytes=send_buffer_bytes),
        "127.0.0.1",
        0,
    )
    try:
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            sndbuf = await asyncio.wait_for(written, 10)
            assert await reader.readexactly(len(payload)) == payload
            return sndbuf
        finally:
            writer.close()
    finally:
        server.close()


def _wmem_max() -> int:
    with open("/proc/sys/net/core/wmem_max") as f:
        return int(f.read())


async def test_a_response_that_does_not_fit_widens_the_oss_send_buffer() -> None:
    """A consumer's fetch of several MiB: the connection's send buffer, left to the OS, is
    raised once to what RESPONSE_SEND_BUFFER asks (within net.core.wmem_max), so the next
    such response goes into the socket in one write."""
    payload = os.urandom(16 * 1024 * 1024)  # more than any buffer takes at once
    asked = min(RESPONSE_SEND_BUFFER, _wmem_max())
    sndbuf = await _serve_once(payload, -1)
    assert sndbuf >= 2 * asked


async def test_a_send_buffer_set_by_the_property_is_never_widened() -> None:
    payload = os.urandom(4 * 1024 * 1024)
    assert await _serve_once(payload, 48 * 1024) == 2 * 48 * 1024


async def test_a_response_that_fits_leaves_the_oss_send_buffer_alone() -> None:
    """A Produce acknowledgement fits: the OS keeps sizing the buffer (not raised, not
    locked)."""
    sndbuf = await _serve_once(b"x" * 1000, -1)
    assert sndbuf < 2 * min(RESPONSE_SEND_BUFFER, _wmem_max())

"""FrameConnection's reading side, driven as a transport drives a BufferedProtocol: frames of
any size (under and over the staging buffer) cut into reads of any size come out whole and in
order; large ones are the request's own writable memory; a bad size prefix ends the stream
after the frames before it, without allocating the announced size."""

from __future__ import annotations

import socket
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from automq_py.network.frames import STAGE_SIZE, FrameConnection
from protocol.errors import FrameTooLargeError, InvalidFrameError

MAX = 1 << 20


class FakeTransport:
    def __init__(self) -> None:
        self.paused = False
        self.closing = False

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def is_closing(self) -> bool:
        return self.closing

    def get_extra_info(self, name: str) -> Any:
        return None


async def _ignore(_: FrameConnection) -> None:
    return None


def connect(max_queued: int = 1000) -> tuple[FrameConnection, FakeTransport]:
    conn = FrameConnection(_ignore, MAX, max_queued=max_queued)
    transport = FakeTransport()
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


def feed(conn: FrameConnection, data: bytes, cuts: list[int]) -> None:
    """Deliver ``data`` as reads of the given sizes (each at most what get_buffer offers)."""
    pos, i = 0, 0
    while pos < len(data):
        buffer = conn.get_buffer(-1)
        n = min(len(buffer), len(data) - pos, max(1, cuts[i % len(cuts)]))
        buffer[:n] = data[pos : pos + n]
        conn.buffer_updated(n)
        pos += n
        i += 1


def framed(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">i", len(p)) + p for p in payloads)


sizes = st.one_of(
    st.integers(0, 300), st.integers(STAGE_SIZE - 8, STAGE_SIZE + 8), st.integers(0, 3 * STAGE_SIZE)
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(sizes, min_size=1, max_size=6),
    st.lists(st.integers(1, 200_000), min_size=1, max_size=8),
)
async def test_frames_come_out_whole_and_in_order(lengths: list[int], cuts: list[int]) -> None:
    payloads = [bytes([i % 251]) * n for i, n in enumerate(lengths)]
    conn, _ = connect()
    feed(conn, framed(payloads), cuts)
    conn.eof_received()
    out = []
    while (frame := await conn.next_frame(1)) is not None:
        out.append(frame)
    assert [bytes(f) for f in out] == payloads
    for frame, payload in zip(out, payloads, strict=True):
        # a frame that did not fit the stage was read into memory of its own, and so is a
        # Produce request (API key 0: the broker edits its batches in place); kio takes the
        # others only read-only
        produce = payload[:2] == b"\0\0"
        assert frame.readonly == (4 + len(payload) <= STAGE_SIZE and not produce)


@pytest.mark.parametrize(
    ("prefix", "error"), [(-1, InvalidFrameError), (MAX + 1, FrameTooLargeError)]
)
async def test_a_bad_size_prefix_ends_the_stream_after_the_frames_before_it(
    prefix: int, error: type[Exception]
) -> None:
    conn, transport = connect()
    feed(conn, framed([b"ok"]) + struct.pack(">i", prefix) + b"x" * 100, [7])
    assert transport.paused  # nothing more is read, nothing of the announced size allocated
    assert bytes(await conn.next_frame(1) or b"") == b"ok"
    with pytest.raises(error):
        await conn.next_frame(1)


async def test_reading_pauses_while_frames_wait_and_resumes_when_taken() -> None:
    conn, transport = connect(max_queued=4)
    feed(conn, framed([b"a"] * 4), [1000])
    assert transport.paused
    for _ in range(2):
        await conn.next_frame(1)
    assert not transport.paused


async def test_an_idle_connection_times_out() -> None:
    conn, _ = connect()
    with pytest.raises(TimeoutError):
        await conn.next_frame(0.05)


class SocketTransport(FakeTransport):
    """A transport over a real connected TCP socket (only its options are used)."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self.sock = sock

    def get_extra_info(self, name: str) -> Any:
        return self.sock if name == "socket" else None


async def test_every_read_asks_for_an_immediate_ack() -> None:
    """A client with Nagle's algorithm on (librdkafka's default) sends a request smaller than a
    segment only once the one before it is acknowledged: the connection asks the kernel for
    quick ACKs after every read (the mode ends by itself), so the ACK does not wait to ride on
    a response that waits for the WAL."""
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        conn = FrameConnection(_ignore, MAX)
        conn.connection_made(SocketTransport(accepted))  # type: ignore[arg-type]
        for _ in range(3):
            accepted.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 0)
            feed(conn, framed([b"request"]), [100])
            assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK) == 1
    finally:
        for s in (client, accepted, server):
            s.close()

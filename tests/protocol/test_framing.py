"""FrameDecoder and encode_frame."""

from __future__ import annotations

import struct

import pytest

from protocol.errors import FrameTooLargeError, InvalidFrameError
from protocol.framing import FrameDecoder, encode_frame


def frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def test_frames_split_at_every_byte_boundary() -> None:
    payloads = [b"a" * 10, b"", b"xyz" * 100, b"q"]
    data = b"".join(frame(p) for p in payloads)
    for step in (1, 2, 3, 7, 64, len(data)):
        decoder = FrameDecoder()
        got: list[bytes] = []
        for i in range(0, len(data), step):
            got += [bytes(f) for f in decoder.feed(data[i : i + step])]
        assert got == payloads
        assert decoder.buffered == 0


def test_frames_are_read_only_and_stable_after_more_feeds() -> None:
    decoder = FrameDecoder()
    (first,) = decoder.feed(frame(b"hello") + b"\x00\x00")
    assert first.readonly
    decoder.feed(b"\x00\x03abc")
    assert bytes(first) == b"hello"


def test_oversized_and_negative_sizes_raise() -> None:
    with pytest.raises(FrameTooLargeError) as info:
        FrameDecoder(max_frame_size=100).feed(struct.pack(">i", 101))
    assert (info.value.size, info.value.max_size) == (101, 100)
    with pytest.raises(InvalidFrameError):
        FrameDecoder().feed(struct.pack(">i", -1))
    # Exactly the limit is allowed.
    assert FrameDecoder(max_frame_size=3).feed(frame(b"abc")) == [memoryview(b"abc")]


def test_encode_frame_keeps_parts_uncopied() -> None:
    big = memoryview(bytes(100_000))
    parts = encode_frame([b"head", big, b""])
    assert parts[0] == struct.pack(">i", 100_004)
    assert parts[2] is big
    assert len(parts) == 3

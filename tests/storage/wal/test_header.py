"""The WAL header: round trip, validation, and falling back to the other copy."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage.wal import header
from storage.wal.errors import CorruptWALError
from storage.wal.header import WALHeader

SAMPLE = WALHeader(
    generation=7,
    capacity=1 << 20,
    trim_offset=12345,
    flushed_offset=20000,
    window=8 << 20,
    node_id=3,
    shutdown_clean=True,
)


def test_round_trip() -> None:
    assert header.decode(header.encode(SAMPLE)) == SAMPLE
    assert len(header.encode(SAMPLE)) == header.ENCODED_SIZE


def test_generations_alternate_between_the_slots() -> None:
    assert SAMPLE.position == 4096
    assert dataclasses.replace(SAMPLE, generation=8).position == 0


@pytest.mark.parametrize(("position", "message"), [(0, "bad magic"), (30, "CRC mismatch")])
def test_a_damaged_copy_is_rejected(position: int, message: str) -> None:
    encoded = bytearray(header.encode(SAMPLE))
    encoded[position] ^= 0xFF
    with pytest.raises(CorruptWALError, match=message):
        header.decode(encoded)


def test_choose_prefers_the_newest_valid_copy() -> None:
    older = dataclasses.replace(SAMPLE, generation=6, trim_offset=100)
    chosen, problems = header.choose([header.encode(older), header.encode(SAMPLE)])
    assert chosen == SAMPLE and problems == []


def test_a_torn_newest_copy_falls_back_to_the_other() -> None:
    older = dataclasses.replace(SAMPLE, generation=6, trim_offset=100)
    torn = header.encode(SAMPLE)[:20] + bytes(40)  # the write stopped part-way
    chosen, problems = header.choose([header.encode(older), torn])
    assert chosen == older
    assert len(problems) == 1 and problems[0].startswith("copy 1:")


def test_no_valid_copy_names_both_problems() -> None:
    with pytest.raises(CorruptWALError, match=r"copy 0: .*; copy 1: "):
        header.choose([bytes(60), b"\xff" * 60])


@given(st.binary(max_size=80))
def test_random_bytes_raise_only_corrupt_wal_error(data: bytes) -> None:
    with contextlib.suppress(CorruptWALError):
        header.decode(data)

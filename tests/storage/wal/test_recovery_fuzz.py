"""Recovery over random damage: it raises nothing but the WAL's own CorruptWALError (and that
only when both header copies are gone), returns exactly the records before the first damaged
byte, and appending afterwards works."""

from __future__ import annotations

import asyncio
import os
import tempfile

from hypothesis import given, settings
from hypothesis import strategies as st

from storage.wal import CorruptWALError, FileWAL, record
from storage.wal.header import HEADER_AREA_SIZE, SLOT_SIZE

CAPACITY = 4096


def write_at(path: str, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


async def create(path: str) -> None:
    wal = await FileWAL.open(path, CAPACITY)
    await wal.close()


async def recover_and_append(path: str) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]]]:
    """Recover, append one record, reopen: the records seen before and after."""
    wal = await FileWAL.open(path, CAPACITY)
    before = [(r.offset, bytes(r.body)) for r in wal.recover()]
    await wal.trim(before[0][0] if before else wal.next_offset)
    await wal.append(b"appended after recovery")
    await wal.close(clean=False)
    wal = await FileWAL.open(path, CAPACITY)
    after = [(r.offset, bytes(r.body)) for r in wal.recover()]
    await wal.close()
    return before, after


@settings(max_examples=150, deadline=None)
@given(
    bodies=st.lists(st.binary(max_size=300), max_size=8),
    garbage=st.binary(max_size=800),
    flips=st.lists(st.tuples(st.integers(0, CAPACITY - 1), st.integers(1, 255)), max_size=3),
    header_noise=st.sampled_from([None, 0, 1, 2]),
    noise=st.binary(min_size=1, max_size=64),
)
def test_recovery_of_damaged_files_yields_a_valid_prefix(
    bodies: list[bytes],
    garbage: bytes,
    flips: list[tuple[int, int]],
    header_noise: int | None,
    noise: bytes,
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "wal")
        asyncio.run(create(path))
        ring = bytearray()
        for body in bodies:
            ring += b"".join(bytes(p) for p in record.encode(len(ring), [body]))
        end_of_records = len(ring)
        ring += garbage[: CAPACITY - len(ring)]
        original = bytes(ring)
        for position, mask in flips:
            if position < len(ring):
                ring[position] ^= mask
        write_at(path, HEADER_AREA_SIZE, bytes(ring))
        if header_noise is not None:
            for slot in (0, 1) if header_noise == 2 else (header_noise,):
                write_at(path, slot * SLOT_SIZE, noise)

        # the records before the first damaged byte must come back, in order
        first_damage = next(
            (p for p in range(end_of_records) if ring[p] != original[p]), end_of_records
        )
        intact: list[tuple[int, bytes]] = []
        offset = 0
        for body in bodies:
            if offset + record.record_size(len(body)) > first_damage:
                break
            intact.append((offset, body))
            offset += record.record_size(len(body))

        try:
            before, after = asyncio.run(recover_and_append(path))
        except CorruptWALError:
            # both header copies destroyed is the only way to get here
            assert header_noise == 2
            return
        assert before == intact
        assert after[:-1] == before and after[-1][1] == b"appended after recovery"

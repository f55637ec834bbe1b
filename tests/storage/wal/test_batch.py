"""A WAL commit's bytes: the zeros after it, its runs of the ring, its staging copy."""

from __future__ import annotations

import mmap

from hypothesis import given
from hypothesis import strategies as st

from storage.wal import record
from storage.wal.batch import PAGE_SIZE, Write, is_one_run, page_fill, stage, write_runs
from storage.wal.header import HEADER_AREA_SIZE
from storage.wal.record import HEADER_SIZE

CAPACITY = 16 * PAGE_SIZE


def joined(buffers: list[record.Buffer]) -> bytes:
    return b"".join(bytes(memoryview(b).cast("B")) for b in buffers)


def record_write(offset: int, body: bytes) -> Write:
    return Write(offset, record.record_size(len(body)), [body])


@given(end=st.integers(0, 10 * CAPACITY), live=st.integers(0, CAPACITY))
def test_the_fill_ends_on_a_page_or_at_the_lap_end_or_the_oldest_live_byte(
    end: int, live: int
) -> None:
    trim = max(0, end - live)  # at most a lap behind the end, as the ring keeps it
    fill = page_fill(end, CAPACITY, trim)
    stop = end + fill
    assert 0 <= fill < PAGE_SIZE
    assert stop <= (end // CAPACITY + 1) * CAPACITY  # never past the lap end
    assert stop <= trim + CAPACITY  # never over a live byte
    on_page = (HEADER_AREA_SIZE + stop % CAPACITY) % PAGE_SIZE == 0
    assert on_page or stop == (end // CAPACITY + 1) * CAPACITY or stop == trim + CAPACITY


def test_records_one_after_the_other_are_one_run_followed_by_the_fill() -> None:
    first = record_write(100, b"a" * 10)
    second = record_write(100 + first.size, b"b" * 20)
    runs = write_runs([first, second], CAPACITY, 7)
    assert len(runs) == 1
    position, buffers = runs[0]
    assert position == HEADER_AREA_SIZE + 100
    expected = joined(record.encode(first.offset, [b"a" * 10]))
    expected += joined(record.encode(second.offset, [b"b" * 20])) + bytes(7)
    assert joined(buffers) == expected
    assert is_one_run([first, second])


def test_padding_at_the_lap_end_splits_the_runs_and_takes_no_fill() -> None:
    padding_at = CAPACITY - 40
    padding = Write(padding_at, HEADER_SIZE, None, CAPACITY)
    after = record_write(CAPACITY, b"c" * 5)
    runs = write_runs([padding, after], CAPACITY, 3)
    assert [position for position, _ in runs] == [HEADER_AREA_SIZE + padding_at, HEADER_AREA_SIZE]
    assert joined(runs[0][1]) == record.encode_padding(padding_at, CAPACITY)
    assert joined(runs[1][1]).endswith(bytes(3))
    assert not is_one_run([padding, after])
    # a batch that ends with the padding gets no zeros after it
    only = write_runs([padding], CAPACITY, 5)
    assert joined(only[0][1]) == record.encode_padding(padding_at, CAPACITY)


def test_a_jump_to_the_next_lap_without_padding_is_not_one_run() -> None:
    before = record_write(CAPACITY - 60, b"d" * 20)  # ends 20 bytes before the lap end
    after = record_write(CAPACITY, b"e")
    assert not is_one_run([before, after])
    runs = write_runs([before, after], CAPACITY, 0)
    assert [position for position, _ in runs] == [
        HEADER_AREA_SIZE + CAPACITY - 60,
        HEADER_AREA_SIZE,
    ]


def test_the_staging_copy_holds_the_same_bytes_as_the_runs() -> None:
    writes = []
    offset = 500
    for body in (b"x" * 33, b"", b"y" * 1000):
        writes.append(record_write(offset, body))
        offset += writes[-1].size
    staging = mmap.mmap(-1, PAGE_SIZE)
    length = stage(staging, writes, 11)
    assert length == offset - 500 + 11
    assert staging[:length] == joined(write_runs(writes, CAPACITY, 11)[0][1])
    staging.close()


def test_a_batch_larger_than_the_staging_buffer_is_not_copied() -> None:
    staging = mmap.mmap(-1, PAGE_SIZE)
    big = record_write(0, bytes(PAGE_SIZE))
    assert stage(staging, [big], 0) == -1
    staging.close()

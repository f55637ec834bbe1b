"""FileWAL: appends, group commit, recovery, the ring, backpressure and damaged files."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import logging
import mmap
import os
import random
import struct
import threading
import time
import types
from collections.abc import Callable
from pathlib import Path

import pytest

from storage.wal import (
    CorruptWALError,
    FileWAL,
    WALAppendResult,
    WALError,
    WALRecord,
    file_wal,
    ring_file,
)
from storage.wal import header as wal_header
from storage.wal.header import HEADER_AREA_SIZE, SLOT_SIZE
from storage.wal.record import HEADER_SIZE

CAPACITY = 64 * 1024

pytestmark = pytest.mark.timeout(30)


def recovered(wal: FileWAL) -> list[tuple[int, bytes]]:
    return [(r.offset, bytes(r.body)) for r in wal.recover()]


async def reopen(path: Path, capacity: int = CAPACITY) -> tuple[FileWAL, list[tuple[int, bytes]]]:
    wal = await FileWAL.open(str(path), capacity)
    return wal, recovered(wal)


def ring_position(offset: int, capacity: int = CAPACITY) -> int:
    return HEADER_AREA_SIZE + offset % capacity


def patch_file(path: Path, position: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        f.write(data)


def flip_byte(path: Path, position: int) -> None:
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)
        f.seek(position)
        f.write(bytes([byte[0] ^ 0xFF]))


async def wait_until_the_writer_idles(wal: FileWAL) -> None:
    """The writer thread hands its results back before it goes back to waiting: an append
    right after may still find it busy, and be its."""
    for _ in range(500):
        if wal._writer_idle:
            return
        await asyncio.sleep(0.002)
    raise AssertionError("the writer thread never went idle")


def read_header(path: Path) -> wal_header.WALHeader:
    raw = path.read_bytes()
    found, _ = wal_header.choose([raw[0:SLOT_SIZE], raw[SLOT_SIZE : 2 * SLOT_SIZE]])
    return found


async def test_append_then_recover_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    first = await wal.append(b"hello")
    second = await wal.append([b"multi ", memoryview(b"part"), bytearray(b" body")])
    empty = await wal.append(b"")
    assert first == WALAppendResult(0, HEADER_SIZE + 5)
    assert second.offset == first.next_offset
    assert empty.next_offset == empty.offset + HEADER_SIZE
    assert wal.next_offset == empty.next_offset
    await wal.close()

    wal = await FileWAL.open(str(path), CAPACITY)
    records = list(wal.recover())
    assert [bytes(r.body) for r in records] == [b"hello", b"multi part body", b""]
    assert records[1] == WALRecord(second.offset, second.next_offset, records[1].body)
    assert wal.next_offset == empty.next_offset
    await wal.close()


async def test_concurrent_appends_share_fsyncs(tmp_path: Path) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY)
    results = await asyncio.gather(*(wal.append(i.to_bytes(4, "big") * 10) for i in range(100)))
    stats = wal.stats
    assert stats.appends == 100
    assert stats.fsyncs <= 5  # typically 1: all 100 queue before the writer runs
    assert stats.bytes == 100 * (HEADER_SIZE + 40)
    # acknowledged in submission order, back to back
    assert [r.offset for r in results] == [i * (HEADER_SIZE + 40) for i in range(100)]
    await wal.close()


async def test_the_ring_is_written_with_o_dsync(tmp_path: Path) -> None:
    """A group commit is one pwritev and no fdatasync: the file must be open with O_DSYNC, or
    an acknowledged append would only be in the page cache."""
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY)
    assert fcntl.fcntl(wal._fd, fcntl.F_GETFL) & os.O_DSYNC
    await wal.close()


async def test_each_commit_is_written_up_to_a_page_boundary(tmp_path: Path) -> None:
    """A write ending inside a page the kernel does not hold makes it read that page from the
    disk first, on every commit: each commit is written with zeros up to the next page
    boundary, and not a byte further."""
    page = mmap.PAGESIZE
    capacity = 4 * page
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), capacity)
    ring_end = HEADER_AREA_SIZE + capacity
    patch_file(path, HEADER_AREA_SIZE, b"\xee" * capacity)  # stands for an earlier lap's bytes

    def boundary_after(position: int) -> int:
        return -(-position // page) * page

    first = await wal.append(b"a" * 100)
    raw = path.read_bytes()
    end = ring_position(first.next_offset, capacity)
    boundary = boundary_after(end)
    assert end < boundary and raw[end:boundary] == bytes(boundary - end)
    assert raw[boundary:ring_end] == b"\xee" * (ring_end - boundary)

    # the next commit starts inside that page and ends inside a later one
    second = await wal.append(b"b" * (page + 1000))
    raw = path.read_bytes()
    end = ring_position(second.next_offset, capacity)
    boundary = boundary_after(end)
    assert end < boundary and raw[end:boundary] == bytes(boundary - end)
    assert raw[boundary:ring_end] == b"\xee" * (ring_end - boundary)
    await wal.close(clean=False)
    wal, records = await reopen(path, capacity)
    assert records == [(first.offset, b"a" * 100), (second.offset, b"b" * (page + 1000))]
    await wal.close()


async def test_the_zeros_after_a_commit_stop_at_the_oldest_live_record(tmp_path: Path) -> None:
    capacity = 8192
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), capacity)
    body = b"r" * (1000 - HEADER_SIZE)
    written = [await wal.append(body) for _ in range(8)]  # [0, 8000): no room for another
    await wal.trim(written[1].offset)  # frees [0, 1000), where the next lap starts
    wrapped = await wal.append(b"w" * (500 - HEADER_SIZE))
    assert wrapped == WALAppendResult(capacity, capacity + 500)
    # the page holding the wrapped record's end also holds the oldest live record: the zeros
    # after it stop where that record starts
    await wal.close(clean=False)
    wal, records = await reopen(path, capacity)
    live = [(w.offset, body) for w in written[1:]]
    assert records == [*live, (wrapped.offset, b"w" * (500 - HEADER_SIZE))]
    await wal.close()


_FS_IOC_FIEMAP = 0xC020660B
_FIEMAP_EXTENT_UNWRITTEN = 0x800
_FIEMAP_EXTENT_LAST = 0x1


def unwritten_bytes(path: Path) -> int:
    """Bytes of ``path`` in extents the file system marks unwritten (allocated, never written:
    what fallocate leaves), from the FIEMAP ioctl."""
    header, extent = struct.Struct("=QQIIII"), struct.Struct("=QQQQQIIII")
    unwritten, start = 0, 0
    with open(path, "rb") as f:
        while True:
            request = bytearray(header.pack(start, 2**64 - 1 - start, 0, 0, 64, 0))
            request += bytes(64 * extent.size)
            fcntl.ioctl(f.fileno(), _FS_IOC_FIEMAP, request)
            mapped = header.unpack_from(request)[3]
            if mapped == 0:
                return unwritten
            for i in range(mapped):
                logical, _, length, _, _, flags, *_ = extent.unpack_from(
                    request, header.size + i * extent.size
                )
                if flags & _FIEMAP_EXTENT_UNWRITTEN:
                    unwritten += length
                start = logical + length
                if flags & _FIEMAP_EXTENT_LAST:
                    return unwritten


@pytest.mark.parametrize("init_zero", [True, False])
async def test_a_new_file_is_written_with_zeros_unless_told_not_to(
    tmp_path: Path, init_zero: bool
) -> None:
    """``init_zero`` (s3.wal.init.zero): no block of the new file is left merely allocated, so
    no durable append waits on an extent conversion; without it the ring is fallocated (on a
    file system that supports it, as the test's does)."""
    path = tmp_path / "wal"
    capacity = 4 << 20
    wal = await FileWAL.open(str(path), capacity, init_zero=init_zero)
    try:
        assert path.stat().st_size == HEADER_AREA_SIZE + capacity
        if init_zero:
            assert unwritten_bytes(path) == 0
        else:
            assert unwritten_bytes(path) >= capacity // 2
        assert recovered(wal) == []  # zeros are the end of the log, as unwritten blocks are
        first = await wal.append(b"record")
    finally:
        await wal.close()
    wal, records = await reopen(path, capacity)
    await wal.close()
    assert records == [(first.offset, b"record")]


async def test_a_creation_cut_short_is_redone(tmp_path: Path) -> None:
    """A crash while the file was being created (zero-filling 2 GiB takes seconds) leaves only
    its temporary file: the next open builds the WAL afresh, whatever that file holds."""
    path = tmp_path / "wal"
    capacity = 1 << 20
    (tmp_path / "wal.creating").write_bytes(os.urandom(capacity // 2))
    wal = await FileWAL.open(str(path), capacity, init_zero=True)
    try:
        assert not (tmp_path / "wal.creating").exists()
        assert path.stat().st_size == HEADER_AREA_SIZE + capacity
        assert unwritten_bytes(path) == 0
        assert recovered(wal) == []
        first = await wal.append(b"after")
    finally:
        await wal.close()
    wal, records = await reopen(path, capacity)
    await wal.close()
    assert records == [(first.offset, b"after")]


def hold_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Make every durable write wait until the test sets ``release`` (the second event); the
    first event is set once a write is waiting."""
    in_write = threading.Event()
    release = threading.Event()
    real_pwritev = os.pwritev

    def slow_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        in_write.set()
        release.wait(5)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", slow_pwritev)
    return in_write, release


async def test_appends_arriving_during_a_durable_write_form_the_next_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the writer thread's group commit (inline, the held write would hold the loop)
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY, inline_commit_max=0)
    in_fsync, release = hold_writes(monkeypatch)
    first = asyncio.create_task(wal.append(b"first"))
    await asyncio.to_thread(in_fsync.wait, 5)
    rest = [asyncio.create_task(wal.append(b"x" * i)) for i in range(50)]
    await asyncio.sleep(0.01)
    assert not first.done() and not any(t.done() for t in rest)
    release.set()
    await asyncio.gather(first, *rest)
    assert wal.stats.fsyncs == 2
    assert wal.stats.appends == 51
    await wal.close()


async def test_the_timing_summary_counts_the_wait_behind_a_write_in_progress(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY, inline_commit_max=0)
    in_write, release = hold_writes(monkeypatch)  # the first write lasts until released
    first = asyncio.create_task(wal.append(b"first"))
    await asyncio.to_thread(in_write.wait, 5)
    rest = [asyncio.create_task(wal.append(b"x")) for _ in range(3)]
    await asyncio.sleep(0.15)  # the three are queued behind the held write meanwhile
    release.set()
    await asyncio.gather(first, *rest)
    summary = wal.timing_summary()
    # "2 group commits (0 on the event loop): O_DSYNC write p50 .., p99 .., max 1xx ms;
    # 4 appends: queued p50 .., p99 .., max 1xx ms, acknowledged p50 .., p99 .., max 1xx ms"
    writes, appends = summary.split("; ")
    assert writes.startswith("2 group commits (0 on the event loop): O_DSYNC write")
    assert float(writes.rsplit("max ", 1)[1].removesuffix(" ms")) >= 100
    assert appends.startswith("4 appends: queued")
    queued, acknowledged = appends.split(", acknowledged ")
    assert float(queued.rsplit("max ", 1)[1].removesuffix(" ms")) >= 100
    assert float(acknowledged.rsplit("max ", 1)[1].removesuffix(" ms")) >= 100
    await wal.close()


async def test_recovery_returns_exactly_the_records_past_the_trim_point(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    results = [await wal.append(f"record {i}".encode()) for i in range(20)]
    await wal.trim(results[12].offset)
    await wal.trim(results[5].offset)  # trims never move back
    assert wal.trim_offset == results[12].offset
    await wal.close()

    wal, records = await reopen(path)
    assert wal.trim_offset == results[12].offset
    assert records == [(r.offset, f"record {i}".encode()) for i, r in enumerate(results)][12:]
    await wal.close()


async def test_trim_past_the_end_is_refused(tmp_path: Path) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY)
    result = await wal.append(b"abc")
    with pytest.raises(WALError, match="the log ends at"):
        await wal.trim(result.next_offset + 1)
    await wal.close()


async def test_wrap_around_over_many_laps_never_returns_a_stale_record(tmp_path: Path) -> None:
    capacity = 16 * 1024
    path = tmp_path / "wal"
    rng = random.Random(42)
    wal = await FileWAL.open(str(path), capacity)
    live: list[tuple[int, int, bytes]] = []  # (offset, next_offset, body) of acknowledged records
    for round_ in range(300):
        # At most ~6 KiB per round on top of at most a third of the ring live, so the round
        # always fits: this test is about laps, not backpressure.
        bodies = [rng.randbytes(rng.randint(0, 1500)) for _ in range(rng.randint(1, 4))]
        for body, result in zip(
            bodies, await asyncio.gather(*(wal.append(b) for b in bodies)), strict=True
        ):
            live.append((result.offset, result.next_offset, body))
        # keep at most a third of the ring live, trimming at a record boundary
        while live[-1][1] - live[0][0] > capacity // 3:
            live.pop(0)
        await wal.trim(live[0][0])
        if round_ % 6 == 5:
            await wal.close(clean=rng.random() < 0.5)
            wal, records = await reopen(path, capacity)
            assert records == [(offset, body) for offset, _, body in live]
    assert wal.next_offset > 20 * capacity  # many laps
    await wal.close()


async def test_a_record_that_does_not_fit_the_lap_starts_the_next_one(tmp_path: Path) -> None:
    capacity = 8192
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), capacity)
    a1 = await wal.append(b"a" * 1000)
    # leave 10 bytes at the end of the lap: too few for a header, so skipped implicitly
    a2 = await wal.append(b"a" * (capacity - 10 - a1.next_offset - HEADER_SIZE))
    await wal.trim(a2.offset)
    b = await wal.append(b"b" * 1000)
    assert b.offset == capacity
    await wal.close(clean=False)
    wal, records = await reopen(path, capacity)
    assert [offset for offset, _ in records] == [a2.offset, b.offset]

    # leave 500 bytes: the skip is marked with a padding header
    await wal.trim(b.offset)
    c = await wal.append(b"c" * (2 * capacity - 500 - b.next_offset - HEADER_SIZE))
    await wal.trim(c.offset)
    d = await wal.append(b"d" * 600)
    assert (c.next_offset, d.offset) == (2 * capacity - 500, 2 * capacity)
    await wal.close(clean=False)
    wal, records = await reopen(path, capacity)
    assert [offset for offset, _ in records] == [c.offset, d.offset]
    await wal.close()


async def test_a_record_needing_the_whole_ring_is_written_once_everything_is_trimmed(
    tmp_path: Path,
) -> None:
    capacity = 4096
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), capacity)
    small = await wal.append(b"s" * 1000)
    await wal.trim(small.next_offset)
    big = await asyncio.wait_for(wal.append(b"B" * (capacity - HEADER_SIZE)), 5)
    assert big == WALAppendResult(capacity, 2 * capacity)
    await wal.close(clean=False)
    wal, records = await reopen(path, capacity)
    assert records == [(capacity, b"B" * (capacity - HEADER_SIZE))]
    await wal.close()


async def test_a_record_larger_than_the_capacity_fails_at_once(tmp_path: Path) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), 4096)
    with pytest.raises(WALError, match="larger than the WAL capacity"):
        await wal.append(b"x" * 4096)
    assert (await wal.append(b"fine")).offset == 0
    await wal.close()


async def test_a_full_ring_blocks_appends_until_trim(tmp_path: Path) -> None:
    capacity = 8192
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), capacity)
    body = b"r" * (1024 - HEADER_SIZE)
    written = [await wal.append(body) for _ in range(8)]  # exactly fills the ring
    blocked = asyncio.create_task(wal.append(b"n" * 100))
    await asyncio.sleep(0.05)
    assert not blocked.done()
    await wal.trim(written[0].offset)  # no-op: frees nothing
    await asyncio.sleep(0.02)
    assert not blocked.done()
    await wal.trim(written[1].offset)  # frees the first record
    result = await asyncio.wait_for(blocked, 5)
    assert result.offset == capacity
    await wal.close(clean=False)
    wal, records = await reopen(path, capacity)
    assert records == [(w.offset, body) for w in written[1:]] + [(capacity, b"n" * 100)]
    await wal.close()


async def test_free_space_counts_the_live_log_and_the_records_waiting_for_it(
    tmp_path: Path,
) -> None:
    capacity = 8192
    wal = await FileWAL.open(str(tmp_path / "wal"), capacity)
    assert wal.free_space == capacity
    body = b"r" * (1024 - HEADER_SIZE)
    written = [await wal.append(body) for _ in range(7)]
    assert wal.free_space == 1024
    waiting = [asyncio.create_task(wal.append(body)) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert waiting[0].done() and not waiting[1].done()  # the ring is full: one waits
    assert wal.free_space == -1024
    await wal.trim(written[1].offset)
    await asyncio.wait_for(waiting[1], 5)
    assert wal.free_space == 0
    await wal.close()


async def test_close_fails_appends_still_waiting_for_space(tmp_path: Path) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), 4096)
    await wal.append(b"x" * (4096 - HEADER_SIZE))
    blocked = asyncio.create_task(wal.append(b"y"))
    await asyncio.sleep(0.02)
    await asyncio.wait_for(wal.close(), 5)
    with pytest.raises(WALError, match="waited for ring space"):
        await blocked
    with pytest.raises(WALError, match="closed"):
        await wal.append(b"z")


CorruptFile = Callable[[Path, list[WALAppendResult]], None]


def flip_last_body_byte(path: Path, results: list[WALAppendResult]) -> None:
    flip_byte(path, ring_position(results[-1].next_offset - 1))


def truncate_mid_record(path: Path, results: list[WALAppendResult]) -> None:
    os.truncate(path, ring_position(results[-1].offset) + HEADER_SIZE + 7)


def zero_last_header(path: Path, results: list[WALAppendResult]) -> None:
    patch_file(path, ring_position(results[-1].offset), bytes(HEADER_SIZE))


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (flip_last_body_byte, "body CRC mismatch"),
        (truncate_mid_record, "body CRC mismatch"),
    ],
)
async def test_a_torn_last_record_is_cut_and_appends_continue_there(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, corrupt: CorruptFile, reason: str
) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    results = [await wal.append(f"body number {i}".encode() * 20) for i in range(10)]
    await wal.close()
    corrupt(path, results)

    with caplog.at_level(logging.WARNING, logger="storage.wal.file_wal"):
        wal, records = await reopen(path)
    assert [offset for offset, _ in records] == [r.offset for r in results[:9]]
    assert "recovery cut the log at offset" in caplog.text and reason in caplog.text
    assert "bytes from there on discarded" in caplog.text
    assert wal.next_offset == results[9].offset
    after = await wal.append(b"after the cut")
    assert after.offset == results[9].offset
    await wal.close()

    wal, records = await reopen(path)
    assert records[-1] == (after.offset, b"after the cut") and len(records) == 10
    await wal.close()


async def test_a_zeroed_last_record_after_a_crash_is_the_end_of_the_log(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    results = [await wal.append(b"x" * 100) for _ in range(5)]
    await wal.close(clean=False)
    zero_last_header(path, results)
    wal, records = await reopen(path)
    assert len(records) == 4 and wal.next_offset == results[4].offset
    await wal.close()


async def test_garbage_after_the_last_record_is_ignored(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    results = [await wal.append(b"payload" * i) for i in range(10)]
    await wal.close(clean=False)
    patch_file(path, ring_position(results[-1].next_offset), random.Random(1).randbytes(5000))

    with caplog.at_level(logging.WARNING, logger="storage.wal.file_wal"):
        wal, records = await reopen(path)
    assert records == [(r.offset, b"payload" * i) for i, r in enumerate(results)]
    assert "bad magic" in caplog.text
    appended = await wal.append(b"next")
    assert appended.offset == results[-1].next_offset
    await wal.close()
    wal, records = await reopen(path)
    assert len(records) == 11 and records[-1] == (appended.offset, b"next")
    await wal.close()


async def test_records_written_past_a_cut_never_reappear(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    a, b, c, _ = [await wal.append(bytes([i]) * 100) for i in range(4)]
    await wal.close(clean=False)
    flip_byte(path, ring_position(b.offset) + HEADER_SIZE + 50)  # b torn; c and d intact

    wal, records = await reopen(path)
    assert records == [(a.offset, bytes([0]) * 100)]
    # same size as b: without zeroing past the cut, c would line up right after it
    e = await wal.append(b"E" * 100)
    assert e == WALAppendResult(b.offset, c.offset)
    await wal.close(clean=False)

    wal, records = await reopen(path)
    assert records == [(a.offset, bytes([0]) * 100), (e.offset, b"E" * 100)]
    await wal.close()


async def test_one_damaged_header_copy_falls_back_to_the_other(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    results = [await wal.append(b"data" * i) for i in range(1, 6)]
    await wal.trim(results[1].offset)
    await wal.close()
    newest = read_header(path)

    # A write of the newest copy torn part-way: its slot fails its CRC.
    patch_file(path, newest.position + 8, b"\xee" * 20)
    with caplog.at_level(logging.WARNING, logger="storage.wal.file_wal"):
        wal, records = await reopen(path)
    assert "CRC mismatch" in caplog.text
    assert [offset for offset, _ in records] == [r.offset for r in results[1:]]
    await wal.close()

    # The other copy zeroed: the newest (rewritten since) still carries the log.
    patch_file(path, (read_header(path).slot ^ 1) * SLOT_SIZE, bytes(SLOT_SIZE))
    wal, records = await reopen(path)
    assert [offset for offset, _ in records] == [r.offset for r in results[1:]]
    await wal.close()


async def test_both_header_copies_damaged_is_a_corrupt_wal(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    await wal.close()
    patch_file(path, 0, bytes(2 * SLOT_SIZE))
    with pytest.raises(CorruptWALError, match="no valid WAL header copy"):
        await FileWAL.open(str(path), CAPACITY)


async def test_a_capacity_mismatch_names_the_property(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    await wal.close()
    with pytest.raises(WALError, match=r"s3\.wal\.capacity") as caught:
        await FileWAL.open(str(path), 2 * CAPACITY)
    assert str(CAPACITY) in str(caught.value) and str(2 * CAPACITY) in str(caught.value)


async def test_another_nodes_wal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY, node_id=1)
    await wal.close()
    with pytest.raises(WALError, match="belongs to node 1"):
        await FileWAL.open(str(path), CAPACITY, node_id=2)


async def test_a_wal_open_elsewhere_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ring_file, "LOCK_WAIT_S", 0.3)
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    started = time.monotonic()
    with pytest.raises(WALError, match="in use by another process"):
        await FileWAL.open(str(path), CAPACITY)
    assert time.monotonic() - started >= 0.3  # it waited for the holder to let go first
    await wal.close()
    wal, records = await reopen(path)  # closing released it
    assert records == []
    await wal.close()


async def test_an_existing_wal_must_be_recovered_before_appending(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY)
    await wal.append(b"one")
    with pytest.raises(WALError, match="before the first append"):
        list(wal.recover())
    await wal.close()
    wal = await FileWAL.open(str(path), CAPACITY)
    with pytest.raises(WALError, match="recover"):
        await wal.append(b"two")
    assert recovered(wal) == [(0, b"one")]
    assert (await wal.append(b"two")).offset == HEADER_SIZE + 3
    await wal.close()


async def test_a_failed_durable_write_fails_the_batch_and_every_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY)
    await wal.append(b"durable")

    def failing_pwritev(fd: int, buffers: object, offset: int) -> int:
        # what an O_DSYNC write returns when the device fails to make it durable
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(os, "pwritev", failing_pwritev)
    batch = await asyncio.gather(*(wal.append(b"lost") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, WALError) and "injected" in str(r) for r in batch)
    monkeypatch.undo()  # the disk is fine again, but the WAL must not trust it
    with pytest.raises(WALError, match="failed state"):
        await wal.append(b"later")
    with pytest.raises(WALError, match="failed state"):
        await wal.trim(0)
    assert wal.stats.appends == 1
    await asyncio.wait_for(wal.close(), 5)


async def test_a_failed_write_is_never_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY)

    def failing_pwritev(fd: int, buffers: object, offset: int) -> int:
        raise OSError(errno.ENOSPC, "injected no space")

    monkeypatch.setattr(os, "pwritev", failing_pwritev)
    with pytest.raises(WALError, match="injected no space"):
        await wal.append(b"x")
    monkeypatch.undo()
    with pytest.raises(WALError):
        await wal.append(b"y")
    await wal.close()


async def test_a_record_wider_than_the_window_widens_it_durably(tmp_path: Path) -> None:
    from storage.wal.file_wal import DEFAULT_WINDOW

    path = tmp_path / "wal"
    capacity = 2 * DEFAULT_WINDOW
    wal = await FileWAL.open(str(path), capacity)
    body = os.urandom(DEFAULT_WINDOW + 1000)
    await wal.append(body)
    assert read_header(path).window > DEFAULT_WINDOW
    await wal.close(clean=False)
    wal, records = await reopen(path, capacity)
    assert records == [(0, body)]
    await wal.close()


async def test_an_append_cancelled_before_it_is_written_is_dropped(tmp_path: Path) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), 4096)
    full = await wal.append(b"x" * (4096 - HEADER_SIZE))
    cancelled = asyncio.create_task(wal.append(b"never written"))
    await asyncio.sleep(0.02)  # waiting for ring space
    cancelled.cancel()
    await wal.trim(full.next_offset)
    later = await asyncio.wait_for(wal.append(b"written"), 5)
    assert later.offset == full.next_offset
    assert cancelled.cancelled()
    await wal.close()


async def test_on_done_is_called_once_per_append_in_order(tmp_path: Path) -> None:
    """``submit``'s ``on_done`` gets each append's future, done, once, in append order, before
    the future's own done callbacks run."""
    wal, _ = await reopen(tmp_path / "wal")
    try:
        seen: list[tuple[int, bool, bool]] = []  # (append, future done, its callbacks ran)
        callbacks_ran: set[int] = set()
        futures = []
        for i in range(3):
            future = wal.submit(
                b"x" * (i + 1),
                lambda f, i=i: seen.append((i, f.done(), i in callbacks_ran)),  # type: ignore[misc]
            )
            future.add_done_callback(lambda _, i=i: callbacks_ran.add(i))  # type: ignore[misc]
            futures.append(future)
        await asyncio.gather(*futures)
        assert seen == [(0, True, False), (1, True, False), (2, True, False)]
    finally:
        await wal.close()


async def test_small_commits_are_made_by_the_event_loop_and_large_ones_by_the_thread(
    tmp_path: Path,
) -> None:
    """Appends submitted in one pass of the loop share a commit, which the loop makes itself
    while the writer thread is idle and the batch small; a larger batch goes to the thread.
    Either way each is durable when acknowledged, in offset order."""
    path = tmp_path / "wal"
    wal = await FileWAL.open(str(path), CAPACITY, inline_commit_max=4096, use_io_uring=False)
    small = await asyncio.gather(*(wal.append(f"small {i}".encode()) for i in range(10)))
    assert wal.stats.fsyncs == 1 and wal._inline_commits == 1  # one pass: one commit
    assert "(1 on the event loop)" in wal.timing_summary()
    large = await asyncio.gather(*(wal.append(bytes([i]) * 1000) for i in range(8)))
    assert wal._inline_commits == 1  # 8,000 bytes: the thread's
    assert wal.stats.appends == 18
    offsets = [r.offset for r in small + large]
    assert offsets == sorted(offsets)
    await wal.close(clean=False)
    wal, records = await reopen(path, CAPACITY)
    await wal.close()
    assert [body for _, body in records] == [f"small {i}".encode() for i in range(10)] + [
        bytes([i]) * 1000 for i in range(8)
    ]


async def test_a_commit_the_disk_held_sends_the_next_ones_to_the_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write on the event loop that the disk held holds the loop too: for a while after one,
    the writer thread makes the commits, and a stalled disk then delays only acknowledgements."""
    wal = await FileWAL.open(
        str(tmp_path / "wal"), CAPACITY, inline_commit_max=4096, use_io_uring=False
    )
    real_pwritev = os.pwritev
    delays = [file_wal.INLINE_STALL_S * 1.5]

    def stalling_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        if delays:
            time.sleep(delays.pop())
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", stalling_pwritev)
    await wal.append(b"held by the disk")
    assert wal._inline_commits == 1
    for i in range(5):
        await wal.append(f"after {i}".encode())
    assert wal._inline_commits == 1 and wal.stats.fsyncs == 6  # the thread's
    wal._inline_paused_until = 0.0  # the pause over
    await wait_until_the_writer_idles(wal)
    await wal.append(b"on the loop again")
    assert wal._inline_commits == 2
    await wal.close()


async def test_slow_commits_in_a_row_send_the_next_ones_to_the_thread_a_lone_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A busy disk's slow writes (under a stall) pause the loop's commits only when they come
    in a row: a lone one, between fast writes, leaves them on the loop."""
    wal = await FileWAL.open(
        str(tmp_path / "wal"), CAPACITY, inline_commit_max=4096, use_io_uring=False
    )
    real_pwritev = os.pwritev
    slow = file_wal.INLINE_SLOW_S * 1.5
    assert slow < file_wal.INLINE_STALL_S and file_wal.INLINE_SLOW_RUN == 2
    delays = [slow, slow, 0.0, slow]  # popped from the end: slow, fast, slow, slow
    # The WAL times its writes on a clock only the writes below move: a real O_DSYNC write
    # on a busy machine can itself take INLINE_SLOW_S, and would make the fast one slow.
    clock = [0.0]

    def timed_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        written = real_pwritev(fd, buffers, offset)
        clock[0] += delays.pop() if delays else 0.0
        return written

    monkeypatch.setattr(os, "pwritev", timed_pwritev)
    monkeypatch.setattr(
        file_wal,
        "time",
        types.SimpleNamespace(perf_counter=lambda: clock[0], monotonic=time.monotonic),
    )
    for i in range(3):  # slow, fast, slow: never two in a row
        await wal.append(f"lone {i}".encode())
    assert wal._inline_commits == 3
    await wal.append(b"the second slow one in a row")
    assert wal._inline_commits == 4
    for i in range(3):
        await wal.append(f"after {i}".encode())
    assert wal._inline_commits == 4 and wal.stats.fsyncs == 7  # the thread's
    await wal.close()


async def test_a_slow_durable_write_is_logged_as_it_completes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A write that took DEBUG_SLOW_WRITE_S is logged at DEBUG on automq.wal (the benches
    count them per case), one that took SLOW_WRITE_S at WARNING; a quick one is not."""
    wal = await FileWAL.open(
        str(tmp_path / "wal"), CAPACITY, inline_commit_max=4096, use_io_uring=False
    )
    real_pwritev = os.pwritev
    # far apart: on a loaded machine a write sleeping past DEBUG_SLOW_WRITE_S took a few
    # times longer, and came out a WARNING when the two were 4x apart
    monkeypatch.setattr(file_wal, "SLOW_WRITE_S", file_wal.DEBUG_SLOW_WRITE_S * 30)
    delays = [0.0, file_wal.DEBUG_SLOW_WRITE_S * 40, file_wal.DEBUG_SLOW_WRITE_S * 2]

    def slow_pwritev(fd: int, buffers: list[memoryview], offset: int) -> int:
        time.sleep(delays.pop() if delays else 0.0)
        return real_pwritev(fd, buffers, offset)

    monkeypatch.setattr(os, "pwritev", slow_pwritev)
    with caplog.at_level(logging.DEBUG, logger="automq.wal"):
        for body in (b"slow", b"held", b"quick"):
            await wal.append(body)
            await wait_until_the_writer_idles(wal)
    await wal.close()
    logged = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "automq.wal"]
    assert [level for level, _ in logged] == [logging.DEBUG, logging.WARNING]
    for _, message in logged:
        assert message.startswith(f"WAL {tmp_path / 'wal'}: a durable write of ")
        took = float(message.rsplit(" took ", 1)[1].removesuffix(" ms"))
        assert took >= file_wal.DEBUG_SLOW_WRITE_S * 1000


async def test_the_rings_durable_writes_are_timed_and_logged_with_their_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wal = await FileWAL.open(str(tmp_path / "wal"), CAPACITY, inline_commit_max=4096)
    assert wal._async is not None, "this machine's kernel offers io_uring"
    monkeypatch.setattr(file_wal, "DEBUG_SLOW_WRITE_S", 0.0)  # every write
    with caplog.at_level(logging.DEBUG, logger="automq.wal"):
        await wal.append(b"x" * 1000)
    await wal.close()
    logged = [r.getMessage() for r in caplog.records if r.name == "automq.wal"]
    # one commit: the record and the zeros to its page's end
    assert len(logged) == 1 and f"a durable write of {mmap.PAGESIZE} bytes took" in logged[0]


async def test_a_failed_write_on_the_event_loop_fails_the_batch_and_every_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An inline commit's failed write is the thread's: nothing acknowledged, the WAL failed."""
    wal = await FileWAL.open(
        str(tmp_path / "wal"), CAPACITY, inline_commit_max=4096, use_io_uring=False
    )
    await wal.append(b"durable")
    assert wal._inline_commits == 1

    def failing_pwritev(fd: int, buffers: object, offset: int) -> int:
        raise OSError(errno.EIO, "injected I/O error")

    monkeypatch.setattr(os, "pwritev", failing_pwritev)
    batch = await asyncio.gather(*(wal.append(b"lost") for _ in range(5)), return_exceptions=True)
    assert all(isinstance(r, WALError) and "injected" in str(r) for r in batch)
    assert wal._inline_commits == 2  # the loop made the failed commit
    monkeypatch.undo()
    with pytest.raises(WALError, match="failed state"):
        await wal.append(b"later")
    assert wal.stats.appends == 1
    await asyncio.wait_for(wal.close(), 5)
    wal, records = await reopen(tmp_path / "wal")
    await wal.close()
    assert [body for _, body in records] == [b"durable"]

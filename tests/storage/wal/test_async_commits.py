"""FileWAL's asynchronous commits: the event loop submits its commits to an io_uring and
acknowledges them when the eventfd says they are durable."""

from __future__ import annotations

import asyncio
import errno
import mmap
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

from storage.wal import FileWAL, WALError, async_commits, uring
from storage.wal.header import HEADER_AREA_SIZE
from storage.wal.interface import WALAppendResult
from storage.wal.record import HEADER_SIZE
from storage.wal.uring import RingWriter, open_ring

CAPACITY = 64 * 1024

pytestmark = pytest.mark.timeout(60)


async def open_ring_wal(path: Path, capacity: int = CAPACITY, inline: int = 4096) -> FileWAL:
    wal = await FileWAL.open(str(path), capacity, inline_commit_max=inline)
    assert wal._async is not None, "this machine's kernel offers io_uring"
    return wal


async def reopen(path: Path, capacity: int = CAPACITY) -> tuple[FileWAL, list[tuple[int, bytes]]]:
    wal = await FileWAL.open(str(path), capacity)
    return wal, [(r.offset, bytes(r.body)) for r in wal.recover()]


async def trim_and_check(
    wal: FileWAL,
    path: Path,
    live: list[tuple[int, int, bytes]],
    rng: random.Random,
    *,
    capacity: int,
    inline: int,
    reopen_now: bool,
) -> FileWAL:
    """Keep at most half the ring live (``live``: offset, next offset and body of each record
    appended, oldest first), trimming at a record boundary; then, when ``reopen_now``, close
    (cleanly or not), check that recovery yields exactly the live records, and open it again."""
    while live[-1][1] - live[0][0] > capacity // 2:
        live.pop(0)
    await wal.trim(live[0][0])
    if not reopen_now:
        return wal
    await wal.close(clean=rng.random() < 0.5)
    reopened, records = await reopen(path, capacity)
    assert records == [(offset, body) for offset, _, body in live]
    await reopened.close()
    wal = await open_ring_wal(path, capacity, inline=inline)
    assert [(r.offset, bytes(r.body)) for r in wal.recover()] == records
    return wal


async def failed_for_good(
    wal: FileWAL, results: Sequence[object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every append of ``results`` failed with the injected I/O error; with the ring's reap
    real again, the WAL refuses later appends, keeps the one acknowledged before, and
    closes."""
    assert all(isinstance(r, WALError) and "Input/output error" in str(r) for r in results)
    monkeypatch.undo()
    with pytest.raises(WALError, match="failed state"):
        await wal.append(b"later")
    assert wal.stats.appends == 1
    await asyncio.wait_for(wal.close(), 5)


def await_completions(ring: RingWriter | None, count: int = 1) -> None:
    """Block until ``count`` completions wait on ``ring``, unreaped: no pass of the event loop
    meanwhile, so its eventfd stays unread."""
    assert ring is not None
    deadline = time.monotonic() + 10
    while True:
        head = ring.reaped()
        if uring._U32.unpack_from(ring._ring, ring._cq.tail)[0] - head >= count:
            return
        assert time.monotonic() < deadline
        time.sleep(0.001)


async def completed_write_with_appends_queued(
    wal: FileWAL,
) -> tuple[asyncio.Future[WALAppendResult], list[asyncio.Future[WALAppendResult]]]:
    """One append written through the ring, completed and not yet acknowledged, and three
    more queued behind it."""
    first = wal.submit(b"alone")
    await asyncio.sleep(0)
    assert wal._async is not None and len(wal._async.batches) == 1
    queued = [wal.submit(f"queued {i}".encode()) for i in range(3)]
    await_completions(wal._async.writer)
    assert not first.done()
    return first, queued


def file_bytes(path: Path, position: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(position)
        return f.read(length)


async def test_the_loops_commits_go_through_the_ring_and_are_durable(tmp_path: Path) -> None:
    path = tmp_path / "wal"
    wal = await open_ring_wal(path)
    await asyncio.gather(*(wal.append(f"first {i}".encode()) for i in range(10)))
    assert wal._async_commits == 1 and wal.stats.fsyncs == 1  # one pass, one write
    assert "(1 on the event loop, 1 of them asynchronous)" in wal.timing_summary()
    second = await asyncio.gather(*(wal.append(bytes([i]) * 700) for i in range(3)))
    assert wal._async_commits == 2
    end = second[-1].next_offset  # the write was zero-filled to its page's end
    page_end = -(-(HEADER_AREA_SIZE + end) // mmap.PAGESIZE) * mmap.PAGESIZE
    assert file_bytes(path, HEADER_AREA_SIZE + end, page_end - HEADER_AREA_SIZE - end) == bytes(
        page_end - HEADER_AREA_SIZE - end
    )
    await wal.close(clean=False)
    wal, records = await reopen(path)
    await wal.close()
    assert [body for _, body in records] == [f"first {i}".encode() for i in range(10)] + [
        bytes([i]) * 700 for i in range(3)
    ]


async def test_appends_while_a_write_is_in_flight_form_the_next_one_queued_behind_it(
    tmp_path: Path,
) -> None:
    wal = await open_ring_wal(tmp_path / "wal")
    try:
        first = wal.submit(b"alone")
        await asyncio.sleep(0)  # the commit is made at the loop's next pass: now in flight
        assert len(wal._async.batches) == 1 and not first.done()
        rest = [wal.submit(f"queued {i}".encode()) for i in range(5)]
        await asyncio.sleep(0)  # submitted at once, behind the first
        assert len(wal._async.batches) == 2 and wal._async.batches[1].behind
        assert not any(f.done() for f in rest)
        await asyncio.gather(first, *rest)
        assert wal.stats.fsyncs == 2 and wal._async_commits == 2
        offsets = [f.result().offset for f in (first, *rest)]
        assert offsets == sorted(offsets)
    finally:
        await wal.close()


async def test_commit_now_acknowledges_a_completed_write_and_sends_what_queued_behind_it(
    tmp_path: Path,
) -> None:
    """A connection about to wait calls commit_now: a write that completed meanwhile is
    acknowledged there, without the loop's pass that reads the eventfd, and the appends
    queued behind it go out at once as the next write."""
    wal = await open_ring_wal(tmp_path / "wal")
    try:
        first, queued = await completed_write_with_appends_queued(wal)
        wal.commit_now()
        assert first.done() and first.result().offset == 0
        assert wal._async_commits == 1 and len(wal._async.batches) == 1  # the queued ones
        assert not any(f.done() for f in queued)
        results = await asyncio.gather(*queued)
        assert wal._async_commits == 2
        assert [r.offset for r in results] == sorted(r.offset for r in results)
        wal.commit_now()  # nothing in flight, nothing queued: nothing happens
        assert not wal._async.batches
    finally:
        await wal.close()


async def test_acknowledge_completed_answers_a_completed_write_and_leaves_the_queued_ones(
    tmp_path: Path,
) -> None:
    """A connection between two requests it read together calls acknowledge_completed: a
    write that completed meanwhile is acknowledged there, without the loop's pass that reads
    the eventfd; the appends queued behind it wait for commit_now, so the requests read
    together go out as one write."""
    wal = await open_ring_wal(tmp_path / "wal")
    try:
        wal.acknowledge_completed()  # nothing in flight: nothing happens
        first, queued = await completed_write_with_appends_queued(wal)
        wal.acknowledge_completed()
        assert first.done() and first.result().offset == 0
        assert wal._async_commits == 1 and not wal._async.batches  # the queued ones wait
        assert not any(f.done() for f in queued)
        wal.acknowledge_completed()  # nothing in flight now
        wal.commit_now()
        assert len(wal._async.batches) == 1  # the three in one write
        results = await asyncio.gather(*queued)
        assert wal._async_commits == 2 and wal.stats.fsyncs == 2
        assert [r.offset for r in results] == sorted(r.offset for r in results)
    finally:
        await wal.close()


async def test_appends_waiting_for_a_write_acknowledged_between_requests_still_go_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append that found two writes in flight waits for one to finish; when
    acknowledge_completed acknowledges both, it is committed at the loop's next pass, though
    no other append or commit_now comes."""
    monkeypatch.setattr(async_commits, "RING_CHECK_S", 3600.0)
    wal = await open_ring_wal(tmp_path / "wal")
    assert wal._async is not None
    # completions are taken by acknowledge_completed alone until the third append waits: the
    # eventfd's reader would take the first write's during a sleep(0) below whenever the disk
    # is quicker than the test
    loop = asyncio.get_running_loop()
    loop.remove_reader(wal._async.writer.eventfd)
    try:
        first = wal.submit(b"first")
        await asyncio.sleep(0)
        second = wal.submit(b"second")
        await asyncio.sleep(0)  # submitted behind the first
        third = wal.submit(b"third")
        await asyncio.sleep(0)  # no room for a third write in flight: it waits
        assert wal._async is not None and len(wal._async.batches) == 2
        assert not wal._inline_scheduled and len(wal._queue) == 1
        await_completions(wal._async.writer, 2)
        wal.acknowledge_completed()
        assert first.done() and second.done() and not wal._async.batches
        loop.add_reader(wal._async.writer.eventfd, wal._async._on_completion)
        assert (await asyncio.wait_for(third, 5)).offset > second.result().offset
    finally:
        await wal.close()


async def test_ring_and_thread_commits_over_many_laps_never_lose_a_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ring's commits beside the thread's (batches over ASYNC_COMMIT_MAX) and the loop's
    own (padding at a lap end), the zeros after each stopping at the oldest live byte, with the
    WAL closed and recovered every few rounds."""
    monkeypatch.setattr(async_commits, "ASYNC_COMMIT_MAX", 3000)
    capacity = 16 * 1024
    path = tmp_path / "wal"
    rng = random.Random(7)
    wal = await open_ring_wal(path, capacity, inline=256)
    ring = thread = 0
    live: list[tuple[int, int, bytes]] = []
    for round_ in range(300):
        bodies = [rng.randbytes(rng.randint(0, 1500)) for _ in range(rng.randint(1, 4))]
        results = await asyncio.gather(*(wal.append(b) for b in bodies))
        for body, result in zip(bodies, results, strict=True):
            live.append((result.offset, result.next_offset, body))
        if round_ % 6 == 5:
            ring += wal._async_commits
            thread += wal.stats.fsyncs - wal._inline_commits
        wal = await trim_and_check(
            wal, path, live, rng, capacity=capacity, inline=256, reopen_now=round_ % 6 == 5
        )
    await wal.close()
    assert wal.next_offset > 20 * capacity
    assert ring > 100 and thread > 10


async def test_a_failed_ring_write_fails_the_batch_and_every_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    wal = await open_ring_wal(tmp_path / "wal")
    await wal.append(b"durable")
    assert wal._async_commits == 1
    real_reap = RingWriter.reap

    def failing_reap(self: RingWriter) -> list[tuple[int, int]]:
        return [(buffer, -errno.EIO) for buffer, _ in real_reap(self)]

    monkeypatch.setattr(RingWriter, "reap", failing_reap)
    batch = await asyncio.gather(*(wal.append(b"lost") for _ in range(5)), return_exceptions=True)
    await failed_for_good(wal, batch, monkeypatch)
    wal, records = await reopen(tmp_path / "wal")
    await wal.close()
    # the failed batch was never acknowledged; its bytes may have reached the disk (as a
    # write that failed after the device took it)
    assert [body for _, body in records][:1] == [b"durable"]


async def test_writes_queued_behind_others_land_in_order_over_many_laps(tmp_path: Path) -> None:
    """Appends submitted over several passes of the loop: a write is often queued behind the
    one in flight, starting in the page whose end that one fills with zeros. Every record
    is read back from the file, after clean and unclean closes."""
    capacity = 32 * 1024
    path = tmp_path / "wal"
    rng = random.Random(11)
    wal = await open_ring_wal(path, capacity, inline=4096)
    behind: list[object] = []  # the batches seen queued behind another
    live: list[tuple[int, int, bytes]] = []
    for round_ in range(200):
        futures: list[tuple[bytes, asyncio.Future[WALAppendResult]]] = []
        for _ in range(rng.randint(2, 5)):  # one pass each
            for _ in range(rng.randint(1, 3)):
                body = rng.randbytes(rng.randint(0, 900))
                futures.append((body, wal.submit(body)))
            await asyncio.sleep(0)
            behind += [
                b for b in wal._async.batches if b.behind and not any(b is x for x in behind)
            ]
        for body, future in futures:
            result = await future
            live.append((result.offset, result.next_offset, body))
        wal = await trim_and_check(
            wal, path, live, rng, capacity=capacity, inline=4096, reopen_now=round_ % 10 == 9
        )
    await wal.close()
    assert wal.next_offset > 5 * capacity
    assert len(behind) > 50


async def test_a_write_behind_a_failed_one_is_not_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first write in flight fails, the one queued behind it succeeds: the second's
    records follow a hole in the log, so they fail too, and so does every later append."""
    wal = await open_ring_wal(tmp_path / "wal")
    await wal.append(b"durable")
    real_reap = RingWriter.reap
    failed: list[int] = []

    def first_fails(self: RingWriter) -> list[tuple[int, int]]:
        done = []
        for buffer, result in real_reap(self):
            if not failed:
                failed.append(buffer)
                result = -errno.EIO
            done.append((buffer, result))
        return done

    monkeypatch.setattr(RingWriter, "reap", first_fails)
    first = wal.submit(b"lost first")
    await asyncio.sleep(0)
    second = wal.submit(b"lost second")
    await asyncio.sleep(0)
    assert [batch.behind for batch in wal._async.batches] == [False, True]
    results = await asyncio.gather(first, second, return_exceptions=True)
    await failed_for_good(wal, results, monkeypatch)


async def test_a_batch_jumping_to_the_next_lap_without_padding_is_not_the_rings(
    tmp_path: Path,
) -> None:
    """Two appends in one pass: the first ends 10 bytes before the lap's end (too few for a
    padding header), the second starts the next lap. The ring writes one contiguous run, so
    this batch is written by the loop as two, each where it belongs."""
    path = tmp_path / "wal"
    wal = await open_ring_wal(path)
    first = await wal.append(bytes(60_000))
    await wal.trim(first.next_offset)
    gap = 10
    a_body = CAPACITY - gap - first.next_offset - HEADER_SIZE
    a, b = wal.submit(b"a" * a_body), wal.submit(b"b" * 76)
    results = await asyncio.gather(a, b)
    assert results[0].next_offset == CAPACITY - gap and results[1].offset == CAPACITY
    assert os.path.getsize(path) == HEADER_AREA_SIZE + CAPACITY  # nothing written past the ring
    await wal.close(clean=False)
    wal, records = await reopen(path)
    await wal.close()
    assert records == [(first.next_offset, b"a" * a_body), (CAPACITY, b"b" * 76)]


def test_a_write_queued_behind_others_is_flagged_to_drain(tmp_path: Path) -> None:
    """What keeps two writes that share a page in order: the kernel starts the second only
    once the first has completed (IOSQE_IO_DRAIN)."""
    fd = os.open(tmp_path / "file", os.O_CREAT | os.O_WRONLY | os.O_DSYNC, 0o600)
    writer, why = open_ring(fd, 4096, 2)
    assert writer is not None, why
    try:
        flags = []
        for buffer, after_others in ((0, False), (1, True)):
            index = uring._U32.unpack_from(writer._ring, writer._sq.tail)[0] & writer._sq_mask
            writer.submit(buffer, buffer * 4096, 4096, after_others=after_others)
            flags.append(writer._sqes[index * uring._SQE_SIZE + 1])
        assert flags == [0, uring._IOSQE_IO_DRAIN]
        done: list[tuple[int, int]] = []
        deadline = time.monotonic() + 10
        while len(done) < 2:
            assert time.monotonic() < deadline
            done += writer.reap()
            time.sleep(0.001)
        assert sorted(done) == [(0, 4096), (1, 4096)]
    finally:
        writer.close()
        os.close(fd)


def test_completions_the_kernel_kept_in_its_overflow_list_are_reaped(tmp_path: Path) -> None:
    """More completions than the completion ring holds (twice the 4 submission entries), none
    reaped meanwhile: the kernel keeps the rest in its overflow list until the application
    asks for them. ``completed()`` and ``reap()`` flush it; a writer that read the ring alone
    would wait for its last writes forever (a broker's WAL commits stopped that way)."""
    fd = os.open(tmp_path / "file", os.O_CREAT | os.O_WRONLY, 0o600)
    writer, why = open_ring(fd, 4096, 4)
    assert writer is not None, why
    try:
        entries = (writer._cq_mask + 1) + len(writer.staging)
        for i in range(entries):
            writer.submit(i % len(writer.staging), i * 4096, 4096, after_others=False)
            time.sleep(0.005)  # (each completes before the next: none is waited for below)
        deadline = time.monotonic() + 10
        done: list[tuple[int, int]] = []
        while len(done) < entries:
            assert time.monotonic() < deadline, f"{len(done)} of {entries} writes reaped"
            assert writer.completed() or len(done) < writer._cq_mask + 1
            done += writer.reap()
            time.sleep(0.001)
        assert [result for _, result in done] == [4096] * entries
        assert not writer.completed()
    finally:
        writer.close()
        os.close(fd)


async def test_a_completion_no_eventfd_announced_is_acknowledged_by_the_periodic_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends behind an io_uring write whose completion nothing announced are acknowledged
    all the same, within a check's period, and later ones go on."""
    monkeypatch.setattr(async_commits, "RING_CHECK_S", 0.05)
    wal = await open_ring_wal(tmp_path / "wal")
    assert wal._async is not None
    # the announcements go nowhere
    asyncio.get_running_loop().remove_reader(wal._async.writer.eventfd)
    results = await asyncio.wait_for(
        asyncio.gather(*(wal.append(f"record {i}".encode()) for i in range(20))), 5
    )
    assert [r.offset for r in results] == sorted(r.offset for r in results)
    await wal.close()
    wal, records = await reopen(tmp_path / "wal")
    assert [body for _, body in records] == [f"record {i}".encode() for i in range(20)]
    await wal.close()


async def test_a_completion_the_eventfd_announced_is_not_taken_for_an_unannounced_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The periodic check can run in the loop's pass before the one that reads the eventfd:
    a completion waiting then is left to the eventfd's reader, with no warning."""
    wal = await open_ring_wal(tmp_path / "wal")
    assert wal._async is not None
    first, queued = await completed_write_with_appends_queued(wal)
    with caplog.at_level("WARNING", logger=async_commits.logger.name):
        wal._async._check_ring()  # as if its timer came due first
        await asyncio.wait_for(asyncio.gather(first, *queued), 5)
        await asyncio.sleep(async_commits.RING_RECHECK_S * 2)
    assert "unannounced" not in caplog.text
    await wal.close()

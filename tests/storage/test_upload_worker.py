"""The upload worker: objects built from the WAL file, checks of what it reads, its life cycle."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Any

import pytest

from storage.operator.local import LocalObjectStore
from storage.s3_storage import S3Storage
from storage.stream import StreamClient
from storage.stream_record_batch import StreamRecordBatch
from storage.upload import build_object, plan_upload
from storage.upload_worker import ObjectBuffers, RunSpec, UploadWorkerError, build_from_wal
from storage.wal.errors import CorruptWALError
from tests.storage.conftest import StorageFactory, storage_properties
from tests.storage.crash_writer import payload_for
from tests.storage.test_s3_storage import read_all
from tests.support.seaweedfs import SeaweedFS

REPO = Path(__file__).resolve().parents[2]


def _specs(storage: S3Storage) -> tuple[list[RunSpec], list[list[StreamRecordBatch]]]:
    block = storage.cache.active
    plan = plan_upload(block.records, 1 << 40)  # every stream in one Stream Set Object
    specs = [RunSpec.of(run, block) for run in plan.stream_set]
    return specs, plan.stream_set


@pytest.mark.parametrize("seed", range(4))
async def test_objects_built_from_the_wal_are_those_built_from_the_cache(
    make_storage: StorageFactory, seed: int, tmp_path: Path
) -> None:
    """Streams written interleaved, in records of random sizes (some over a data block), read
    back from the WAL file, give the very bytes the cache's own copy of them gives; in a
    bytearray or in the local store's page-aligned memory."""
    storage = await make_storage(**{"s3.wal.upload.threshold": 16 << 20})
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(5)]
    rng = random.Random(seed)
    for _ in range(60):
        s = rng.choice(streams)
        await s.append(payload_for(s.stream_id, s.next_offset, rng.randint(1, 40_000)), 3)
    specs, runs = _specs(storage)
    block_size = rng.choice([1024, 64 << 10, 512 << 10])
    store = LocalObjectStore(tmp_path)

    def dirty_buffer(size: int) -> bytearray | memoryview:
        """The store's buffer, which need not be zeroed, filled with what a reused one might
        hold: a byte the build leaves unwritten shows."""
        buffer = store.new_buffer(size)
        buffer[:] = b"\xa5" * size
        return buffer

    allocate = bytearray if seed % 2 else dirty_buffer
    fd = os.open(storage.wal.path, os.O_RDONLY)
    try:
        built = await asyncio.to_thread(
            build_from_wal, fd, storage.wal.capacity, specs, block_size, allocate
        )
    finally:
        os.close(fd)
    expected = build_object(runs, block_size)
    assert bytes(built.data) == expected.to_bytes()
    assert built.index == expected.index


class _Made:
    """``make`` for ObjectBuffers: a bytearray of each size asked, counted."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __call__(self, size: int) -> bytearray:
        self.sizes.append(size)
        return bytearray(size)


def test_a_buffer_given_back_is_lent_again_unzeroed_and_in_whole_steps() -> None:
    made = _Made()
    buffers = ObjectBuffers(made, max_bytes=64, step=16)
    first = buffers.take(20)
    assert len(first) == 20 and made.sizes == [32]
    first[:] = b"x" * 20
    buffers.give_back(first)
    second = buffers.take(30)  # fits the 32 bytes made for the first
    assert made.sizes == [32]
    assert bytes(second[:20]) == b"x" * 20  # the same memory, as it was left
    third = buffers.take(30)  # the kept one is lent: a new one
    assert made.sizes == [32, 32]
    buffers.give_back(second)
    buffers.give_back(third)
    assert buffers.kept_bytes == 64


def test_the_smallest_kept_buffer_that_fits_is_lent() -> None:
    made = _Made()
    buffers = ObjectBuffers(made, max_bytes=1 << 20, step=16)
    views = [buffers.take(size) for size in (64, 16, 32)]
    for view in views:
        view[:] = bytes([len(view)]) * len(view)
        buffers.give_back(view)
    assert bytes(buffers.take(20)[:1]) == bytes([32])
    assert bytes(buffers.take(10)[:1]) == bytes([16])
    assert bytes(buffers.take(10)[:1]) == bytes([64])
    assert len(made.sizes) == 3


def test_kept_buffers_stay_within_their_bound_and_a_forgotten_one_is_not_lent() -> None:
    made = _Made()
    buffers = ObjectBuffers(made, max_bytes=48, step=16)
    a, b, c = buffers.take(16), buffers.take(32), buffers.take(16)
    for view in (a, b, c):
        buffers.give_back(view)
    assert buffers.kept_bytes == 48  # c did not fit beside a and b: let go
    d = buffers.take(40)  # larger than any kept: made
    buffers.forget(d)  # (its upload failed: a request may still hold it)
    buffers.give_back(d)  # no longer lent: not kept
    assert buffers.kept_bytes == 48 and made.sizes == [16, 32, 16, 48]
    buffers.clear()
    assert buffers.kept_bytes == 0
    buffers.take(8)
    assert made.sizes[-1] == 16


async def test_objects_built_one_after_another_in_one_kept_buffer_are_right(
    make_storage: StorageFactory, tmp_path: Path
) -> None:
    """Two objects built in turn in the one buffer ObjectBuffers keeps, the second smaller, the
    buffer first filled with junk: each holds the very bytes the cache's copy gives."""
    storage = await make_storage(**{"s3.wal.upload.threshold": 16 << 20})
    client = StreamClient(storage)
    streams = [await client.create_and_open() for _ in range(3)]
    rng = random.Random(7)
    for _ in range(40):
        s = rng.choice(streams)
        await s.append(payload_for(s.stream_id, s.next_offset, rng.randint(1, 30_000)), 2)
    specs, runs = _specs(storage)
    store = LocalObjectStore(tmp_path)
    buffers = ObjectBuffers(store.new_buffer)
    junk = buffers.take(1 << 20)
    junk[:] = b"\xa5" * len(junk)
    buffers.give_back(junk)
    fd = os.open(storage.wal.path, os.O_RDONLY)
    try:
        for chosen in (specs, specs[:1]):
            built = await asyncio.to_thread(
                build_from_wal, fd, storage.wal.capacity, chosen, 64 << 10, buffers.take
            )
            expected = build_object(runs[: len(chosen)], 64 << 10)
            assert bytes(built.data) == expected.to_bytes()
            buffers.give_back(built.data)
    finally:
        os.close(fd)
    assert buffers.kept_bytes == 8 << 20  # one buffer, made once


async def test_what_the_wal_does_not_hold_is_refused(make_storage: StorageFactory) -> None:
    storage = await make_storage()
    client = StreamClient(storage)
    a, b = await client.create_and_open(), await client.create_and_open()
    for s in (a, b, a, b):
        await s.append(payload_for(s.stream_id, s.next_offset, 500), 1)
    specs, _ = _specs(storage)
    fd = os.open(storage.wal.path, os.O_RDONLY)
    try:
        first, second = specs
        # the other stream's records
        swapped = RunSpec(first.stream_id, first.base_offset, first.end_offset, second.positions)
        with pytest.raises(UploadWorkerError, match="holds stream"):
            build_from_wal(fd, storage.wal.capacity, [swapped], 1024)
        # an offset that is no record's
        shifted = array("q", first.positions)
        shifted[0] += 8
        with pytest.raises(CorruptWALError):
            build_from_wal(
                fd,
                storage.wal.capacity,
                [RunSpec(first.stream_id, first.base_offset, first.end_offset, shifted)],
                1024,
            )
        # a run that claims more than its records
        longer = RunSpec(first.stream_id, first.base_offset, first.end_offset + 1, first.positions)
        with pytest.raises(UploadWorkerError, match="end at"):
            build_from_wal(fd, storage.wal.capacity, [longer], 1024)
    finally:
        os.close(fd)


def _worker_pid(storage: S3Storage) -> int:
    process = storage.upload_worker._process
    assert process is not None
    return process.pid


async def test_a_killed_worker_is_started_again_and_the_upload_retried(
    make_storage: StorageFactory,
) -> None:
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    payloads = [payload_for(s.stream_id, i, 200_000) for i in range(20)]  # 2 MiB objects
    for p in payloads[:10]:
        await s.append(p, 1)
    await storage.force_upload()  # the worker starts with the first upload
    first = _worker_pid(storage)
    os.kill(first, signal.SIGKILL)
    for p in payloads[10:]:
        await s.append(p, 1)
    async with asyncio.timeout(60):
        await storage.force_upload()
    assert storage.uploads == 2
    assert _worker_pid(storage) != first
    storage.drop_cache()
    assert await read_all(s) == payloads


async def test_small_objects_are_written_without_a_worker(make_storage: StorageFactory) -> None:
    """Objects under INLINE_OBJECT_MAX are built in the broker: no worker starts for them."""
    storage = await make_storage()
    s = await StreamClient(storage).create_and_open()
    payloads = [payload_for(s.stream_id, i, 3000) for i in range(20)]
    for p in payloads:
        await s.append(p, 1)
    await storage.force_upload()
    assert storage.uploads == 1
    assert storage.upload_worker._process is None
    storage.drop_cache()
    assert await read_all(s) == payloads


@pytest.mark.integration
async def test_small_objects_go_to_a_running_worker_with_a_remote_store(
    make_storage: StorageFactory, s3_server: SeaweedFS
) -> None:
    """To S3, once the worker runs, it writes the small objects too: the broker's event loop
    does not run an S3 client's PUT for them (to a local store, a small object costs the loop
    less than the message would)."""
    storage = await make_storage(s3_server.url())
    big, small = (
        await StreamClient(storage).create_and_open(),
        await StreamClient(storage).create_and_open(),
    )
    payloads = [payload_for(big.stream_id, i, 200_000) for i in range(10)]  # 2 MB: the worker's
    for p in payloads:
        await big.append(p, 1)
    await storage.force_upload()
    assert storage.upload_worker.running
    here: list[str] = []  # the broker's own PUTs (the worker's requests count in its stats)
    real_put = storage.store.put

    async def put(key: str, *args: Any, **kwargs: Any) -> None:
        here.append(key)
        await real_put(key, *args, **kwargs)

    storage.store.put = put  # type: ignore[method-assign]
    few = [payload_for(small.stream_id, i, 3000) for i in range(20)]
    for p in few:
        await small.append(p, 1)
    await storage.force_upload()
    assert storage.uploads == 2
    assert here == []
    storage.drop_cache()
    assert await read_all(small) == few
    assert await read_all(big) == payloads


async def test_the_worker_starts_before_the_upload_that_needs_it(
    make_storage: StorageFactory,
) -> None:
    """Once the cache block holds a quarter of the upload threshold (and more than an object
    built in the broker), the worker starts, so the upload does not wait for its start."""
    storage = await make_storage()  # threshold 4 MiB
    s = await StreamClient(storage).create_and_open()
    for i in range(4):  # 0.8 MB: under both
        await s.append(payload_for(s.stream_id, i, 200_000), 1)
    await asyncio.sleep(0.5)
    assert storage.upload_worker._process is None
    for i in range(4, 8):  # 1.6 MB
        await s.append(payload_for(s.stream_id, i, 200_000), 1)
    async with asyncio.timeout(30):
        while storage.upload_worker._process is None:
            await asyncio.sleep(0.02)
    assert storage.uploads == 0


def test_the_worker_ends_with_its_broker(tmp_path: Path) -> None:
    """A writer killed with SIGKILL (once it has uploaded, so its worker runs) closes its end
    of the worker's stdin: the worker exits rather than outlive it."""
    props = storage_properties(
        tmp_path, f"file://{tmp_path}/objects", **{"s3.wal.upload.threshold": 3 << 20}
    )
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.storage.crash_writer",
            json.dumps({"properties": props, "streams": 2}),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None
        deadline = time.monotonic() + 30
        workers: list[int] = []
        while not workers and time.monotonic() < deadline:
            child.stdout.readline()
            children = Path(f"/proc/{child.pid}/task/{child.pid}/children").read_text().split()
            workers = [
                int(pid)
                for pid in children
                if b"storage.upload_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
            ]
        assert workers, "the writer started no upload worker"
    finally:
        child.kill()
        child.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{workers[0]}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{workers[0]}").exists() or _is_zombie(workers[0])


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return True
